"""A keyword's neighbours from the CMU Pronouncing Dictionary (toolkit.tasks.kws.neighbours):
real words that are never the keyword by sound, by category, and accent variants that are
never negatives."""
import itertools

import numpy as np
import pytest

from toolkit.errors import DataError
from toolkit.tasks.kws import corpus as S
from toolkit.tasks.kws import corpus_text as T
from toolkit.tasks.kws import neighbours as N
from toolkit.voicebank import espeak as E

KEYWORDS = ("hey jarvis", "alexa", "hey snips", "ok google")


@pytest.fixture(scope="module")
def lexicon():
    return N.load_lexicon()


def _prons(lex, text):
    return [tuple(itertools.chain(*p)) for p in itertools.product(*(lex.prons(w) for w in text.split()))]


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_a_neighbour_is_a_real_word_never_the_keyword_by_sound(lexicon, keyword):
    nb = N.KeywordNeighbours(keyword, lexicon, T.common_words())
    cats = nb.categories()
    keyword_prons = nb.prons
    keyword_skeletons = {N.consonants(p) for p in keyword_prons}
    assert keyword_prons and sum(len(v) for v in cats.values()) >= 20
    for name, texts in cats.items():
        assert len(texts) == len(set(texts)) <= N.MAX_PER_CATEGORY
        for text in texts:
            assert all(lexicon.is_word(w) for w in text.split()), (name, text)
            prons = _prons(lexicon, text)
            # at least one phone from every pronunciation of the keyword
            assert min(N.edit_distance(p, k) for p in prons for k in keyword_prons) >= 1
            if name in ("real_word", "cross_boundary"):
                # and a consonant: vowels alone are how an accent moves a word
                assert not {N.consonants(p) for p in prons} & keyword_skeletons, text
    assert not set(cats["real_word"]) & set(nb.accent_variants())


def test_categories_of_the_two_keywords(lexicon):
    jarvis = N.KeywordNeighbours("hey jarvis", lexicon, T.common_words()).categories()
    assert {"say jarvis", "way jarvis", "hey sarvis"} <= set(jarvis["real_word"])
    assert jarvis["alone"] == ["hey", "jarvis"] and jarvis["reorder"] == ["jarvis hey"]
    assert "hay jar bus" in jarvis["cross_boundary"]
    alexa = N.KeywordNeighbours("alexa", lexicon, T.common_words()).categories()
    assert {"alexis", "lexus"} <= set(alexa["real_word"])
    assert {"selection", "flexible"} <= set(alexa["inside_word"])
    assert "a lexus" in alexa["cross_boundary"]
    assert alexa["alone"] == [] and alexa["reorder"] == []
    # the real words one vowel away ("alexi") are the accent's, in neither list
    assert "alexi" not in alexa["real_word"] and "alexi" not in N.KeywordNeighbours(
        "alexa", lexicon).accent_variants()


def test_accent_variants_are_no_words_and_one_vowel_away(lexicon):
    variants = N.KeywordNeighbours("hey jarvis", lexicon).accent_variants()
    assert {"hey jarvus", "hey jarvos"} <= set(variants)
    for v in variants:
        changed = [(a, b) for a, b in zip("hey jarvis".split(), v.split()) if a != b]
        assert len(changed) == 1 and not lexicon.is_word(changed[0][1])
        assert [c for c in changed[0][0] if c not in "aeiouyw"] == \
            [c for c in changed[0][1] if c not in "aeiouyw"]   # consonants kept ("ow": a vowel)


def test_an_accent_variant_is_never_a_training_negative():
    voices = S.split_voices(E.espeak_voices(), 5)
    keywords = ["hey jarvis", "alexa"]
    filt = T.TextFilter(keywords, {})
    cats = {k: T.confusable_categories(k) for k in keywords}
    accents = {k: T.accent_variants(k) for k in keywords}
    variants = {v for vs in accents.values() for v in vs}

    def plan(split):
        groups = S.plan_split(split, 200, 800, keywords, voices[split], filt, cats, 3,
                              (5.0, 30.0), conf_share=0.5, hard_share=0.5, accents=accents)
        return [s for g in groups for s in g.specs]

    train = plan("train")
    assert not {s.kind for s in train} & {"accent"}
    conf = [s for s in train if s.kind == "conf"]
    assert len(conf) == 400 and {s.category for s in conf} >= {"real_word", "cross_boundary",
                                                               "inside_word", "alone", "reorder"}
    assert not any(v in s.text for s in conf for v in variants)
    test = plan("test")
    accent = [s for s in test if s.kind == "accent"]
    assert len(accent) == round(S.ACCENT_SHARE * 200)
    assert all(s.category == "accent" and any(v in s.text for v in variants) for s in accent)


def test_lexicon_reader_names_a_bad_line(tmp_path):
    path = tmp_path / "dict"
    path.write_text("hello HH AH0 L OW1\nhello(2) HH EH0 L OW1 # comment\nbroken\n")
    with pytest.raises(DataError, match=r"dict:3: expected 'word PHONE"):
        N.Lexicon.read(str(path))
    path.write_text("hello HH AH0 L OW1\nhello(2) HH EH0 L OW1 # comment\nit's IH1 T S\n")
    lex = N.Lexicon.read(str(path))
    assert lex.prons("hello") == [("HH", "AH", "L", "OW"), ("HH", "EH", "L", "OW")]
    assert not lex.is_word("it's")


def test_distances():
    assert N.edit_distance("kitten", "sitting") == 3
    assert N.edit_distance("abc", "abcdef", limit=2) == 3        # capped above the limit
    assert N.infix_distance(tuple("lexa"), tuple("flexible")) == 1
    assert N.infix_distance(tuple("abc"), tuple("xxabcxx")) == 0
    assert np.isclose(N.edit_distance((), ("a",)), 1)
