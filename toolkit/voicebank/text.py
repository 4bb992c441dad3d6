"""Texts for synthetic speech that no task needs to understand: random sequences of
common English words (every word one espeak-ng, flite and festival pronounce from their
own lexicons), drawn from a numpy generator so that a corpus plan stays a pure function
of its seed."""
import numpy as np

# Common words of every part of speech, so that a random sequence has the rhythm of
# function and content words mixed (short "the of in" between longer nouns and verbs).
WORDS = tuple("""
a able about above accept across act actually add address afraid after afternoon again
against age ago agree ahead air airport all allow almost alone along already also
although always among amount and angry animal another answer any anyone anything
apartment appear apple april area arm army around arrive art article as ask at attack
august aunt autumn available avoid away baby back bad bag bake balance ball banana band
bank base basket bath battery be beach bean bear beautiful because become bed bedroom
beer before begin behind believe bell below belt bench beside best better between
bicycle big bill bird birthday bit bite black blanket blind block blood blue board boat
body boil bone book boot border borrow boss both bottle bottom bowl box boy brain branch
brave bread break breakfast breath brick bridge bright bring brother brown brush build
burn bus business busy but butter button buy by cabbage cake call calm camera camp can
candle cap capital captain car card care careful carpet carry case cash castle cat catch
cause ceiling center chair chance change cheap check cheese chicken child chocolate
choose church circle city class clean clear clever climb clock close cloth cloud coast
coat coffee coin cold collect color comb come comfortable common company compare
complete computer concert control cook cool copy corner correct cost cotton cough could
count country course cousin cover cow crazy cream cross crowd cry cup cupboard curtain
cut dance danger dark date daughter day dead deal dear december decide deep deer
describe desert desk dictionary die different difficult dinner direction dirty discover
dish doctor dog dollar door double down draw dream dress drink drive drop dry duck
during dust early earth east easy eat edge egg eight either elephant else empty end
enemy engine enjoy enough enter envelope equal evening event ever every exam example
excellent except exercise expensive explain eye face fact fair fall false family famous
far farm fast fat father favorite fear feather february feel fence festival few field
fight fill film final find fine finger finish fire first fish five flag flat floor
flower fly fog follow food foot for forest forget fork form forward four fox free
fresh friday friend frog from front fruit full fun funny future game garden gate
general gentle get gift girl give glad glass glove go goat gold good government grass
gray great green ground group grow guess guest guitar hair half hall hand happen happy
harbor hard hat hate have he head health hear heart heavy hello help her here hide high
hill him his history hit hobby hold holiday home honest hope horse hospital hot hotel
hour house how huge hungry hurry husband ice idea if ill important in inside insect
invite island it jacket january job join journey juice july jump june just keep kettle
key kick kind king kitchen kite knee knife knock know ladder lady lake lamp land
language large last late laugh lazy lead leaf learn least leave left leg lemon lend
less lesson letter library lie life lift light like line lion lip list listen little
live long look lose loud love low lucky lunch machine magazine mail make man many map
march market marry matter may me meal mean meat medicine meet member memory message
metal middle might milk mind minute mirror miss mistake modern moment monday money
monkey month moon more morning most mother mountain mouse mouth move much museum music
must my name narrow nation nature near neck need neighbor nest never new news next nice
night nine no noise noon north nose not note nothing notice november now number nurse
object ocean october of off offer office often oil old on once one only open opinion
or orange order other our out outside oven over own page pain paint pair palace paper
parent park part party pass past path pay peace pen pencil people pepper perfect
person photo piano pick picture piece pig pillow pink place plan plane plant plate
play please pocket poem point police polite pool poor popular possible post pot potato
power practice present pretty price prince print prize problem promise proud pull
pupil purple push put queen question quick quiet rabbit race radio rain read ready
real reason red remember repeat reply rest restaurant rice rich ride right ring river
road rock roof room root rope rose round rule run sad safe sail salt same sand
saturday save say school science sea season seat second see sell send september serve
seven shadow shake shape share sharp she sheep shelf shine ship shirt shoe shop short
should shoulder shout show shower shut sick side sign silver simple sing sister sit
six size skin skirt sky sleep slow small smell smile smoke snake snow so soap sock
soft soldier some son song soon sorry sound soup south space speak special spend
spoon sport spring square stairs stand star start station stay step stick still stone
stop storm story straight strange street strong student study sugar summer sun sunday
supper sure surprise sweet swim table tail take talk tall taste taxi tea teach team
tell ten tent test than thank that the theater their then there they thick thin thing
think thirsty this three throw thursday ticket tiger time tired to today together
tomato tomorrow tonight too tooth top touch towel tower town toy train travel tree
trip trouble true try tuesday turn twelve two ugly umbrella uncle under understand
until up use useful usual valley vegetable very village visit voice wait wake walk
wall want warm wash watch water wave way we weak wear weather wednesday week welcome
well west wet what wheel when where which while white who why wide wife wild will win
window wine winter wise wish with without woman wonder wood word work world worry
write wrong yard year yellow yes yesterday you young your zero
""".split())


def random_words(rng: np.random.Generator, low: int, high: int) -> str:
    """`low` to `high` words (both included) drawn with replacement, space-separated."""
    count = int(rng.integers(low, high + 1))
    return " ".join(WORDS[int(i)] for i in rng.integers(len(WORDS), size=count))
