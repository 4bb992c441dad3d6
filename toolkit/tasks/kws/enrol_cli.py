"""toolkit.bin.kws's personal wake word: its options, their usage errors, and enrolment to
a file with its one-line summary (toolkit.tasks.kws.enrol does the work)."""
from typing import Optional, Sequence

from toolkit.tasks.kws.enrol import DEFAULT_CONTEXT_S, DEFAULT_SPEAKER_ENCODER, enrol


def enrol_to_file(detector, clips: Sequence, out: str, encoder: Optional[str] = None,
                  context_s: Optional[float] = None) -> str:
    """`enrol` with the defaults for None, saved to `out`; the one-line summary."""
    enrolment = enrol(detector, clips, encoder or DEFAULT_SPEAKER_ENCODER,
                      DEFAULT_CONTEXT_S if context_s is None else context_s)
    enrolment.save(out)
    return (f"{out}: enrolled {len(enrolment.clips)} clip(s) of {', '.join(enrolment.keywords)}; "
            f"speaker threshold {enrolment.threshold:.4f} ({enrolment.scoring}); "
            f"encoder {enrolment.encoder}")


def add_enrolment_arguments(p) -> None:
    """toolkit.bin.kws's options of the personal wake word."""
    p.add_argument("--enroll", nargs="+", metavar="CLIP_OR_DIR", default=None,
                   help="enrol your voice from clips of the keyword (WAVs or folders) into --out")
    p.add_argument("--out", default="", help="with --enroll: the enrolment to write (me.enrol)")
    p.add_argument("--enrolled", default="", help="an enrolment: keep only detections said "
                   "in its voice")
    p.add_argument("--speaker-model", default=None, help="the speaker encoder to enrol with, "
                   f"pretrained:NAME or an export (default {DEFAULT_SPEAKER_ENCODER}); with "
                   "--enrolled: the enrolment's encoder at another path")
    p.add_argument("--context-s", type=float, default=None, help="with --enroll: seconds of "
                   f"audio embedded either side of the keyword (default {DEFAULT_CONTEXT_S})")


def check_enrolment_arguments(p, args) -> None:
    """Those options' usage errors (p.error), alone and with the binary's others."""
    enrolling = args.enroll is not None
    for wrong, message in (
            (enrolling and args.enrolled, "--enroll writes an enrolment: it takes no --enrolled"),
            (enrolling and args.calibrate, "--enroll takes no --calibrate"),
            (enrolling and args.inputs, "--enroll takes no files to detect in (its clips "
                                        "follow it: put --out before them?)"),
            (enrolling and not args.out, "--enroll needs --out FILE, the enrolment to write"),
            (args.out and not enrolling, "--out names the file --enroll writes: give --enroll"),
            (args.enrolled and args.calibrate, "--calibrate takes no --enrolled"),
            (args.speaker_model is not None and not (enrolling or args.enrolled),
             "--speaker-model goes with --enroll or --enrolled"),
            (args.context_s is not None and not enrolling,
             "--context-s goes with --enroll (an enrolment keeps its own)"),
            (args.context_s is not None and args.context_s < 0, "--context-s must be >= 0")):
        if wrong:
            p.error(message)
