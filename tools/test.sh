#!/usr/bin/env bash
# Installs the toolkit (tools/install.sh) and runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash tools/test.sh -k resume -x`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/tools/install.sh" test codec hf wandb
# The real engines and peers the tests run: a test whose engine is missing fails, it never
# skips. Kokoro is assembled once into ${TOOLKIT_CACHE:-~/.cache/toolkit}/kokoro and reused
# by later runs; festival and flite are Debian packages (apt-get needs root or sudo).
bash "$root/tools/install_voices.sh" kokoro festival flite
bash "$root/tools/install_resemblyzer.sh"
bash "$root/tools/install_oww.sh"
cd "$root"
set +e
# Most tests wait on training subprocesses: one pytest worker per core, each test file on
# one worker (module fixtures are built once).
workers=$(nproc 2>/dev/null || echo 2)
"$root/tools/venv/bin/python" -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile "$@" tests
rc=$?
set -e
# pytest exits 5 when it collected no tests: that is a failure here, not a pass.
if [ $rc -eq 5 ]; then
  echo "no tests were collected" >&2
  exit 1
fi
exit $rc
