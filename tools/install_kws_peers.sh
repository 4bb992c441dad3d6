#!/usr/bin/env bash
# Opt-in: two more wake-word peers for tools/benchmarks/oww_compare.py (--micro-wakeword,
# --pocketsphinx) into the toolkit's venv. No recipe needs them.
#   pymicro-wakeword 2.5.0 (Apache-2.0): microWakeWord's streaming TFLite detectors
#     (alexa, hey_jarvis, hey_mycroft, okay_nabu), its own libtensorflowlite_c.so and
#     pymicro-features 2.0.2 (Apache-2.0), the 10 ms micro-frontend features they read.
#   pocketsphinx 5.1.1 (BSD-2-Clause, CMU; bundled WebRTC VAD BSD-3, small MIT parts): CMU
#     Sphinx with its en-us acoustic model (BSD, Alpha Cephei), dictionary and LM; used for
#     keyphrase spotting.
# All three go in with --no-deps: pocketsphinx's one requirement, sounddevice, serves only
# its microphone input (and needs PortAudio); pymicro-wakeword's other one is numpy, which
# must stay as installed. torch and numpy are checked unchanged afterwards.
# Safe to rerun: does nothing when those versions are installed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TOOLKIT_VENV:-$root/tools/venv}
want=(pymicro-wakeword==2.5.0 pymicro-features==2.0.2 pocketsphinx==5.1.1)

die() { echo "error: $*" >&2; exit 2; }

[ -x "$venv/bin/python" ] || die "no toolkit venv at $venv: run bash tools/install.sh first"
venv_version() {      # version of a distribution in the venv, "" when absent
  "$venv/bin/python" -c 'import sys; from importlib.metadata import version
print(version(sys.argv[1]))' "$1" 2>/dev/null || true
}

missing=()
for spec in "${want[@]}"; do
  [ "$(venv_version "${spec%%==*}")" = "${spec#*==}" ] || missing+=("$spec")
done
[ ${#missing[@]} -gt 0 ] || exit 0
torch_before=$(venv_version torch)
numpy_before=$(venv_version numpy)
echo "[install] ${missing[*]} (--no-deps) into $venv" >&2
"$venv/bin/python" -m pip install -q --no-deps "${missing[@]}" \
  || die "pip install ${missing[*]} failed"
[ "$(venv_version torch)" = "$torch_before" ] \
  || die "installing the peers changed torch $torch_before -> $(venv_version torch)"
[ "$(venv_version numpy)" = "$numpy_before" ] \
  || die "installing the peers changed numpy $numpy_before -> $(venv_version numpy)"
"$venv/bin/python" -c '
from pymicro_wakeword import MicroWakeWord, Model
from pocketsphinx import Decoder
MicroWakeWord.from_builtin(Model.HEY_JARVIS)
Decoder(keyphrase="hey jarvis", kws_threshold=1e-40, loglevel="ERROR")' \
  >/dev/null || die "the peers are installed but do not load"
echo "[install] ${want[*]} installed" >&2
