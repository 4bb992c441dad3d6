#!/usr/bin/env bash
# Opt-in: openWakeWord 0.5.1 into the toolkit's venv, for dataset.feature.type
# speech_embedding (its melspectrogram.onnx + embedding_model.onnx front end) and for
# tools/benchmarks/oww_compare.py (its pretrained detectors). --no-deps: its tflite-runtime
# requirement is not installable here and not needed (the toolkit runs the ONNX files).
# Licences: openWakeWord's code Apache-2.0; its included pre-trained models CC BY-NC-SA 4.0
# (non-commercial). Nothing of it is copied into the repository or into exported models.
# Safe to rerun: does nothing when that version is installed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TOOLKIT_VENV:-$root/tools/venv}
want=0.5.1
have=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("openwakeword"))' \
       2>/dev/null || true)
if [ "$have" = "$want" ]; then
  exit 0
fi
echo "[install] openwakeword==$want (--no-deps) into $venv: models CC BY-NC-SA 4.0, non-commercial" >&2
"$venv/bin/python" -m pip install -q --no-deps "openwakeword==$want"
