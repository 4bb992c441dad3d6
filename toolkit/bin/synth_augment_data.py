"""Write the augmentation banks a training config's dataset.reverb.rir_list and
dataset.noise.noise_list read: room impulse responses by the image method (small, medium
and large rooms, source and microphone placed at random; toolkit.data.rir) and noise clips
(white, pink, brown, and babble of the talkers of --babble-list). Seeded; rerunning with
the same arguments leaves a finished bank alone.

  python -m toolkit.bin.synth_augment_data --out-dir data/aug --num-rirs 300 \\
      --num-noise 200 --babble-list data/train/data.list --seed 777
  # then: dataset.reverb.rir_list=data/aug/rirs.list dataset.noise.noise_list=data/aug/noise.list
"""
import argparse
import sys

from toolkit.errors import cli
from toolkit.logging_utils import setup_logging


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True, help="writes rirs/, rirs.list, noise/, noise.list")
    p.add_argument("--num-rirs", type=int, default=300, help="room impulse responses (0: none)")
    p.add_argument("--num-noise", type=int, default=200, help="noise clips (0: none)")
    p.add_argument("--noise-seconds", type=float, default=8.0, help="length of each noise clip")
    p.add_argument("--babble-list", default="",
                   help="data list of speech whose talkers make the babble half of the noise")
    p.add_argument("--seed", type=int, default=777)
    p.add_argument("--sample-rate", type=int, default=16000)
    args = p.parse_args(argv)
    for name in ("num_rirs", "num_noise"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.noise_seconds <= 0:
        p.error("--noise-seconds must be > 0")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.voicebank.augment_bank import write_noise_bank, write_rir_bank
    if args.num_rirs:
        write_rir_bank(args.out_dir, args.num_rirs, args.seed, args.sample_rate)
    if args.num_noise:
        write_noise_bank(args.out_dir, args.num_noise, args.noise_seconds, args.seed,
                         args.babble_list, args.sample_rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
