# Sourced by run.sh: makes the toolkit's virtual environment (tools/venv) current,
# creating it on first use.
TOOLKIT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
bash "$TOOLKIT_ROOT/tools/install.sh" codec || { echo "installing the toolkit failed" >&2; return 1; }
export PATH="$TOOLKIT_ROOT/tools/venv/bin:$PATH"
export PYTHONUNBUFFERED=1
export LC_ALL=C
