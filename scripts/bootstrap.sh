# Sourced by demo/test: make ./.venv with the kit (and test tools) installed; nothing is assumed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "sparkstack needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
    exit 2
fi
if [ ! -x "$ROOT/.venv/bin/python" ]; then
    "$PY" -m venv "$ROOT/.venv"
fi
"$ROOT/.venv/bin/pip" install --quiet --disable-pip-version-check -e "$ROOT${EXTRAS:-}"
export PATH="$ROOT/.venv/bin:$PATH"
