#!/usr/bin/env bash
# Creates tools/venv (once) with the toolkit installed in editable mode, plus the
# test, TTS, codec-metric, Hugging Face datasets and W&B extras. Safe to rerun: it does
# nothing when the install is current.
# TOOLKIT_EXTRAS=oww also installs openWakeWord's front end (tools/install_oww.sh; opt-in,
# its models are CC BY-NC-SA 4.0); nothing by default needs it. TOOLKIT_VOICES="kokoro
# rhvoice ..." also installs those TTS engines (tools/install_voices.sh; opt-in).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TOOLKIT_VENV:-$root/tools/venv}
python=${PYTHON:-python3}
stamp=$venv/.toolkit-installed
# Reinstall when setup.py changes, so new requirements arrive on a plain rerun.
want=$(cksum < "$root/setup.py")
extras() {
  case ",${TOOLKIT_EXTRAS:-}," in
    *,oww,*) TOOLKIT_VENV=$venv bash "$root/tools/install_oww.sh" ;;
  esac
  if [ -n "${TOOLKIT_VOICES:-}" ]; then
    # shellcheck disable=SC2086  # a list of engine names
    TOOLKIT_VENV=$venv bash "$root/tools/install_voices.sh" $TOOLKIT_VOICES
  fi
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && (cd / && "$venv/bin/python" -c "import toolkit.bin" 2>/dev/null); then
  extras
  exit 0
fi
# An install killed while creating the venv leaves one without pip: create it afresh.
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "[install] creating virtual environment $venv" >&2
  "$python" -m venv --clear "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
# Pin torch first: torch==2.13.0 is a local CPU wheel here; an open range would fetch CUDA.
"$venv/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
"$venv/bin/python" -m pip install -q -e "$root[test,tts,codec,hf,wandb]"
echo "$want" > "$stamp"
echo "[install] toolkit installed in $venv" >&2
extras
