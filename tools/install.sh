#!/usr/bin/env bash
# Creates tools/venv (once) with the toolkit installed in editable mode and the TTS extra
# (espeak-ng: every self-contained recipe speaks), plus the setup.py extras named:
#
#   bash tools/install.sh                 # what the wake-word and speaker recipes need
#   bash tools/install.sh codec           # + codec baselines and metrics (a C/C++ build)
#   bash tools/install.sh channels        # + Codec2 and Opus alone (rooms and channels of a corpus)
#   bash tools/install.sh test codec hf wandb   # everything the test suite runs
#
# Extras once installed stay installed. Safe to rerun: it does nothing when the install is
# current and holds the extras asked for.
# TOOLKIT_EXTRAS=oww also installs openWakeWord's front end (tools/install_oww.sh; opt-in,
# its models are CC BY-NC-SA 4.0); nothing by default needs it. TOOLKIT_VOICES="kokoro
# rhvoice ..." also installs those TTS engines (tools/install_voices.sh; opt-in).
set -euo pipefail

# pip older than 20.3 cannot install manylinux_2_28 wheels (PEP 600: torch's, onnxruntime's)
# and lacks the dependency resolver; Python 3.10's own pip (ensurepip) is newer already.
pip_min=20.3
# Upgrades pip only when it is older than `min`: a newer pip is never needed to install,
# so a failed upgrade (offline, a broken mirror) is a warning and the install goes on.
upgrade_old_pip() {   # python [min]
  local python=$1 min=${2:-$pip_min} have
  have=$("$python" -c 'from importlib.metadata import version; print(version("pip"))')
  "$python" -c 'import sys
version = lambda text: tuple(int(x) for x in text.split(".")[:2] if x.isdigit())
sys.exit(version(sys.argv[1]) >= version(sys.argv[2]))' "$have" "$min" || return 0
  echo "[install] upgrading pip $have (older than $min)" >&2
  "$python" -m pip install -q --upgrade pip \
    || echo "[install] warning: upgrading pip $have failed (offline?): installing with it" >&2
}
# Whether `venv` was made for another place: the stamp names another venv, or the shebang
# of its pip (written for the venv's own python when pip was installed) another python. A
# checkout copied with `cp -r` (or moved) brings such a venv along: its scripts (torchrun,
# pip) start the other venv's python and its editable install imports the other
# checkout's code. Only a new venv is right.
made_elsewhere() {   # venv stamp
  "$1/bin/python" - "$1" "$2" 2>/dev/null <<'PY'
import os, sys
venv = os.path.realpath(sys.argv[1])
try:
    with open(sys.argv[2]) as f:
        recorded = f.read().split("\n")[1]
except (OSError, IndexError):
    recorded = ""
if recorded and os.path.realpath(recorded) != venv:
    sys.exit(0)
try:
    with open(os.path.join(venv, "bin", "pip"), "rb") as f:
        head = f.read(4096).decode("utf-8", "replace").split("\n")
except OSError:
    sys.exit(1)
if head[0] == "#!/bin/sh" and len(head) > 1:
    words = head[1].split('"')[1:2]      # pip's trampoline for a path with spaces
else:
    words = head[0][2:].split()[:1] if head[0].startswith("#!") else []
sys.exit(not words or os.path.realpath(os.path.dirname(os.path.dirname(words[0]))) == venv)
PY
}
# Sourced (the tests run the functions above): nothing else.
(return 0 2>/dev/null) && return 0

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TOOLKIT_VENV:-$root/tools/venv}
python=${PYTHON:-python3}
stamp=$venv/.toolkit-installed
known="test tts kokoro codec channels hf wandb"
asked=(tts)
for e in "$@"; do
  case " $known " in *" $e "*) asked+=("$e") ;;
    *) echo "error: unknown extra '$e'; known: $known" >&2; exit 2 ;; esac
done
# The stamp: setup.py's checksum (a change reinstalls, so new requirements arrive on a
# plain rerun) and the extras installed.
sum=$(cksum < "$root/setup.py" | cut -d' ' -f1,2)
have=""
[ -f "$stamp" ] && read -r stamp_sum1 stamp_sum2 have_list < "$stamp" 2>/dev/null \
  && [ "$stamp_sum1 $stamp_sum2" = "$sum" ] && have=" ${have_list//,/ } "
need=()
for e in "${asked[@]}"; do case "$have" in *" $e "*) ;; *) need+=("$e") ;; esac; done
extras() {
  case ",${TOOLKIT_EXTRAS:-}," in
    *,oww,*) TOOLKIT_VENV=$venv bash "$root/tools/install_oww.sh" ;;
  esac
  if [ -n "${TOOLKIT_VOICES:-}" ]; then
    # shellcheck disable=SC2086  # a list of engine names
    TOOLKIT_VENV=$venv bash "$root/tools/install_voices.sh" $TOOLKIT_VOICES
  fi
}
fresh=0
if [ -x "$venv/bin/python" ] && made_elsewhere "$venv" "$stamp"; then
  echo "[install] $venv was made for another place (a copied or moved checkout): creating" \
       "it afresh" >&2
  fresh=1
fi
# Current only when `import toolkit` in the venv is this checkout's code.
if [ $fresh = 0 ] && [ -n "$have" ] && [ ${#need[@]} -eq 0 ] \
   && (cd / && "$venv/bin/python" -c 'import os, sys, toolkit.bin
sys.exit(os.path.realpath(toolkit.bin.__path__[0]) != os.path.realpath(sys.argv[1]))' \
       "$root/toolkit/bin" 2>/dev/null); then
  extras
  exit 0
fi
# Not current: two runs that find it so at once (two recipes started after a pull that
# changed setup.py) would run pip in one venv together, and one of them fail. One at a
# time, and the one that waited checks again (usually: current now, nothing to do).
if [ -z "${TOOLKIT_INSTALL_LOCKED:-}" ] && command -v flock >/dev/null 2>&1; then
  mkdir -p "$(dirname "$venv")"
  exec env TOOLKIT_INSTALL_LOCKED=1 flock "${venv%/}.install-lock" bash "$0" "$@"
fi
# What the venv holds afterwards: what it held (same setup.py) and what is asked for.
all=$(echo $have "${asked[@]}" | tr ' ' '\n' | grep . | sort -u | tr '\n' ',' | sed 's/,$//')
codec=0
case ",$all," in *,codec,*) codec=1 ;; esac
# Beyond python3, a Debian machine needs venv support and, for the codec extra's sdists
# (pesq: C; libsvm-official, which visqol-python requires: C++), compilers and the Python
# headers. Installed with apt-get when running as root, else named with the command.
missing=()
if [ $fresh = 1 ] || ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  "$python" -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=("python3-venv")
fi
if [ $codec = 1 ]; then
  command -v cc >/dev/null 2>&1 || missing+=("gcc" "libc6-dev")
  command -v g++ >/dev/null 2>&1 || missing+=("g++")
  "$python" -c "import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
    || missing+=("python3-dev")
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[install] installing Debian packages: ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "[install] missing system packages: ${missing[*]}; install them (Debian:" \
         "sudo apt-get install ${missing[*]}) and rerun" >&2
    exit 1
  fi
fi
# An install killed while creating the venv leaves one without pip: create it afresh.
if [ $fresh = 1 ] || ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "[install] creating virtual environment $venv" >&2
  "$python" -m venv --clear "$venv"
fi
upgrade_old_pip "$venv/bin/python"
# Pin torch first: torch==2.13.0 is a local CPU wheel here; an open range would fetch CUDA.
"$venv/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
"$venv/bin/python" -m pip install -q -e "$root[$all]"
# pip byte-compiles what it installs, not an editable checkout; where PYTHONDONTWRITEBYTECODE
# is set (containers, CI) no import writes the cache either, and every process of a recipe
# or a test run would compile the toolkit's modules again.
"$venv/bin/python" -m compileall -q "$root/toolkit" >/dev/null \
  || echo "[install] warning: byte-compiling $root/toolkit failed" >&2
# The numba kernels of ViSQOL (about a minute) and of librosa, which DNSMOS uses (16 CPU-s
# in each process importing it first), compile on first use into numba's cache beside
# their packages: once here, not in the first evaluation or in each of a test run's workers.
if [ $codec = 1 ] && ! (cd / && "$venv/bin/python" -c "from toolkit.tasks.codec.metrics import warm_up_numba_metrics
warm_up_numba_metrics()" >/dev/null 2>"$venv/.metrics-warm-up.log"); then
  echo "[install] warning: the codec metrics' warm-up failed (see $venv/.metrics-warm-up.log)" >&2
fi
# The venv's own path on the second line: a copy of it elsewhere is then known.
printf '%s %s\n%s\n' "$sum" "$all" "$(cd "$venv" && pwd -P)" > "$stamp"
echo "[install] toolkit installed in $venv (extras: $all)" >&2
extras
