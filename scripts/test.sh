#!/usr/bin/env bash
# Runs the test suite: installs what is missing, lints, then pytest (real PostgreSQL 15 and 18,
# real local Spark, real Airflow). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
.venv/bin/ruff check .
exec .venv/bin/pytest "$@"
