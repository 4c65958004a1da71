#!/usr/bin/env bash
# Builds the model zoo in one command: a venv with torch and friends in $MLOPT_ZOO (default
# ~/.cache/mlopt/zoo, outside the repository), then bench/zoo/build.py (arguments passed on).
# Idempotent: the venv is made and filled once, exported models are kept (--force exports again).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
zoo="${MLOPT_ZOO:-$HOME/.cache/mlopt/zoo}"
mkdir -p "$zoo"
if [ ! -x "$zoo/venv/bin/python" ]; then
    echo "zoo: creating the venv $zoo/venv"
    python3 -m venv "$zoo/venv" || { apt-get install -y -qq python3-venv && python3 -m venv "$zoo/venv"; }
fi
# (The dry run is not --quiet, which would hide its "Would install", and its output is read whole:
# `| grep -q` would close the pipe early, and with pipefail pip's broken pipe would read as "nothing
# to install".)
plan="$("$zoo/venv/bin/python" -m pip install --disable-pip-version-check --dry-run -r "$here/requirements.txt" 2>/dev/null || true)"
if ! grep -q "Would install" <<<"$plan"; then
    echo "zoo: venv has the pinned packages"
else
    echo "zoo: installing the pinned packages (torch pulls several GB)"
    "$zoo/venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
fi
MLOPT_ZOO="$zoo" exec "$zoo/venv/bin/python" "$here/build.py" "$@"
