#!/usr/bin/env bash
# Runs the test suite: installs what is missing, lints, then pytest (real PostgreSQL 15 and 18,
# real local Spark, real Airflow). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
.venv/bin/ruff check .
if [ "$#" -gt 0 ]; then
    exec .venv/bin/pytest "$@"
fi
# The whole suite. The YugabyteDB CDC-service crash and scenario suites run in a pytest session of
# their own (a fresh Airflow home): after the rest of the suite in one session, Airflow's SQLite
# metadata database reports "database disk image is malformed" to them, while in a session of
# their own (or after the other YugabyteDB suites) they pass. The cause is not found yet (issue 17).
ISOLATED=(tests/integration/yugabyte_cdc/test_crash_safety.py tests/integration/yugabyte_cdc/test_example_dag.py)
status=0
.venv/bin/pytest "${ISOLATED[@]/#/--ignore=}" || status=$?
.venv/bin/pytest "${ISOLATED[@]}" || { code=$?; [ "$status" -ne 0 ] || status=$code; }
exit "$status"
