#!/usr/bin/env bash
# Installs the toolkit (tools/install.sh) and runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash tools/test.sh -k resume -x`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/tools/install.sh" test codec hf wandb
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
