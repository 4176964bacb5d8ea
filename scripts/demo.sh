#!/usr/bin/env bash
# Runs the demo: installs what is missing, then the example DAG end to end (see scripts/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec .venv/bin/python scripts/demo.py "$@"
