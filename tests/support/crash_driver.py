"""Child process of the crash-safety tests: runs one capture task, to be killed mid-way.

``python -m tests.support.crash_driver '<json>'`` with ``{"source": "postgres"|"sqlserver"|"yugabyte",
"step": "setup"|"snapshot"|"batch", "capture": {...the capture's fields...}}`` (``source``
defaults to ``postgres``). The source's adapter (``tests/support/crash_sources.py``) builds the
capture from the fields and names the step's operator. Faults at named points come from
``AIRFLOW_CDC_FAULT`` (see ``airflow_provider_cdc.cdc.basics.faults``). The driver prints ``ready``
once imports are done, so a parent that kills it at a random moment kills the task, not the
interpreter's start-up.

Exit codes: 0 done, 3 skipped, 1 failed (the error on stderr), -9 killed.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    from airflow_provider_cdc.version_compat import AirflowSkipException
    from tests.support.crash_sources import SOURCES

    source = SOURCES[config.get("source", "postgres")]
    source.child_setup()
    operator = source.operator(config["step"])(task_id=config["step"], capture=source.build(config["capture"]))
    print("ready", flush=True)  # the parent may now kill this process at a random moment
    try:
        result = operator.execute({})
    except AirflowSkipException:
        return 3
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
