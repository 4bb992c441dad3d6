#!/usr/bin/env bash
# Installs the toolkit (tools/install.sh) and runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash tools/test.sh -k resume -x`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/tools/install.sh" test codec hf wandb
# The real engines and peers the tests run: a test whose engine is missing fails, it never
# skips. Kokoro is assembled once into ${TOOLKIT_CACHE:-~/.cache/toolkit}/kokoro and reused
# by later runs; the others are Debian packages (apt-get needs root or sudo). rhvoice, pico
# and mbrola come from contrib/non-free: running the suite is the explicit request to enable
# them (the script keeps a backup of apt's sources and prints the change; a no-op once done).
# Two of mbrola_accent's 16 databases (all of them are 157 MB), the ones its tests speak with.
bash "$root/tools/install_voices.sh" --enable-nonfree kokoro festival flite rhvoice pico mbrola \
  mbrola_accent:de1,pl1
bash "$root/tools/install_resemblyzer.sh"
bash "$root/tools/install_oww.sh"
bash "$root/tools/install_kws_peers.sh"
cd "$root"
set +e
# Each test file runs on one worker (module fixtures are built once). Tests spend a quarter
# of their time waiting (process start-up, rendezvous, a kill's aftermath): with one worker
# per core the cores idle meanwhile, so there is one worker more than cores.
workers=$(( $(nproc 2>/dev/null || echo 2) + 1 ))
# Files are handed out in the order tests/conftest.py collects them, slowest first
# (--no-loadscope-reorder: xdist would otherwise hand out the files with the most tests
# first, and the one-test recipe files ran last, each alone at the end). The slowest tests
# are listed at the end: the suite's budget is 12 minutes on 2 cores.
"$root/tools/venv/bin/python" -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile \
  --no-loadscope-reorder --durations=20 "$@" tests
rc=$?
set -e
# pytest exits 5 when it collected no tests: that is a failure here, not a pass.
if [ $rc -eq 5 ]; then
  echo "no tests were collected" >&2
  exit 1
fi
exit $rc
