"""Child process of the crash-safety tests: runs one capture task, to be killed mid-way.

``python -m tests.support.crash_driver '<json>'`` with ``{"step": "setup"|"snapshot"|"batch",
"capture": {...PostgresCapture fields...}}``. Faults at named points come from
``AIRFLOW_CDC_FAULT`` (see ``airflow_provider_cdc.cdc.faults``). The driver prints ``ready``
once imports are done, so a parent that kills it at a random moment kills the task, not the
interpreter's start-up.

Exit codes: 0 done, 3 skipped, 1 failed (the error on stderr), -9 killed.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    from airflow_provider_cdc.capture import PostgresCapture
    from airflow_provider_cdc.operators.postgres_cdc import (
        PostgresCdcBatchOperator,
        PostgresCdcSetupOperator,
        PostgresCdcSnapshotOperator,
    )
    from airflow_provider_cdc.version_compat import AirflowSkipException

    operators = {
        "setup": PostgresCdcSetupOperator,
        "snapshot": PostgresCdcSnapshotOperator,
        "batch": PostgresCdcBatchOperator,
    }
    operator = operators[config["step"]](task_id=config["step"], capture=PostgresCapture(**config["capture"]))
    print("ready", flush=True)  # the parent may now kill this process at a random moment
    try:
        result = operator.execute({})
    except AirflowSkipException:
        return 3
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
