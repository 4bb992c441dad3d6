#!/usr/bin/env bash
# Opt-in: Resemblyzer 0.1.4 (Apache-2.0; a GE2E speaker encoder trained on real speech,
# its weights inside the wheel) into the toolkit's venv, for
# tools/benchmarks/resemblyzer_compare.py. No recipe or test needs it.
#
# resemblyzer's own requirements name `webrtcvad` (an sdist that needs a C compiler) and
# `typing` (a backport for Python < 3.5): it goes in with --no-deps, and what it imports
# comes separately: webrtcvad-wheels (the same `webrtcvad` module, prebuilt) and librosa.
# torch is held at its installed version; torchaudio must not come along (FACTS: its
# PyPI build does not import here). Safe to rerun: does nothing when installed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TOOLKIT_VENV:-$root/tools/venv}
want=0.1.4

die() { echo "error: $*" >&2; exit 2; }

[ -x "$venv/bin/python" ] || die "no toolkit venv at $venv: run bash tools/install.sh first"
venv_version() {      # version of a distribution in the venv, "" when absent
  "$venv/bin/python" -c 'import sys; from importlib.metadata import version
print(version(sys.argv[1]))' "$1" 2>/dev/null || true
}

if [ "$(venv_version resemblyzer)" = "$want" ] && [ -n "$(venv_version webrtcvad-wheels)" ] \
   && [ -n "$(venv_version librosa)" ]; then
  exit 0
fi
torch_before=$(venv_version torch)
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
[ -z "$torch_before" ] || echo "torch==$torch_before" > "$constraints"
echo "[install] resemblyzer==$want (--no-deps), webrtcvad-wheels, librosa into $venv" >&2
"$venv/bin/python" -m pip install -q -c "$constraints" webrtcvad-wheels "librosa>=0.9.1" \
  || die "pip install webrtcvad-wheels librosa failed"
"$venv/bin/python" -m pip install -q --no-deps "resemblyzer==$want" \
  || die "pip install resemblyzer==$want failed"
[ "$(venv_version torch)" = "$torch_before" ] \
  || die "installing resemblyzer changed torch $torch_before -> $(venv_version torch)"
[ -z "$(venv_version torchaudio)" ] || die "torchaudio came along; it does not import here"
# The mel spectrogram also compiles librosa's numba kernels into numba's cache, once here
# rather than (16 CPU-s) in every process that first uses them.
"$venv/bin/python" -c 'import numpy, webrtcvad, resemblyzer
resemblyzer.VoiceEncoder("cpu")
resemblyzer.audio.wav_to_mel_spectrogram(numpy.ones(16000, numpy.float32) * 0.1)' \
  >/dev/null || die "resemblyzer is installed but does not load"
echo "[install] resemblyzer==$want installed" >&2
