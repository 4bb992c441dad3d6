#!/usr/bin/env bash
# Creates tools/venv (once) with the toolkit installed in editable mode, plus the
# test and TTS extras. Safe to rerun: it does nothing when the install is current.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TOOLKIT_VENV:-$root/tools/venv}
python=${PYTHON:-python3}
stamp=$venv/.toolkit-installed
# Reinstall when setup.py changes, so new requirements arrive on a plain rerun.
want=$(cksum < "$root/setup.py")
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && (cd / && "$venv/bin/python" -c "import toolkit.bin" 2>/dev/null); then
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "[install] creating virtual environment $venv" >&2
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
# Pin torch first: torch==2.13.0 is a local CPU wheel here; an open range would fetch CUDA.
"$venv/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
"$venv/bin/python" -m pip install -q -e "$root[test,tts]"
echo "$want" > "$stamp"
echo "[install] toolkit installed in $venv" >&2
