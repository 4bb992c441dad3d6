# Sourced by run.sh: puts the toolkit's virtual environment (tools/venv) first on PATH,
# creating it through tools/install.sh the first time (a no-op once it is current).
TOOLKIT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
bash "$TOOLKIT_ROOT/tools/install.sh" || { echo "installing the toolkit failed" >&2; return 1; }
export PATH="$TOOLKIT_ROOT/tools/venv/bin:$PATH"
export PYTHONUNBUFFERED=1
export LC_ALL=C
