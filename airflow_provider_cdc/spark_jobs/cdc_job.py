"""``spark-submit`` entry point: run one capture window from a job spec file.

    spark-submit .../cdc_job.py --spec /path/spec.json [--result /path/result.json]

The spec holds no password; it is read from the environment variable the spec names (the
operator passes it through SparkSubmitHook's ``env_vars``). Imports only the engine.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="path of the job spec JSON")
    parser.add_argument("--result", help="where to write the commit-log entry as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from airflow_provider_cdc.cdc.basics.errors import CdcError
    from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session
    from airflow_provider_cdc.cdc.planning.spec import StateJobSpec, job_kind

    text = Path(args.spec).read_text(encoding="utf-8")
    try:
        if job_kind(text) == StateJobSpec.job:
            from airflow_provider_cdc.cdc.state.jobs import run_state_job

            state_spec = StateJobSpec.from_json(text)
            result: object = run_state_job(state_spec, lambda: get_or_create_session(state_spec.spark, submitted=True))
        else:
            from airflow_provider_cdc.cdc.jobs import run_window_job, spec_from_json

            spec = spec_from_json(text)
            spec = replace(spec, connection=spec.connection.with_password_from_env())
            result = run_window_job(spec, lambda: get_or_create_session(spec.spark, submitted=True)).to_dict()
    except CdcError as exc:
        logging.getLogger("airflow_provider_cdc").error("%s: %s", type(exc).__name__, exc)
        return 2 if exc.terminal else 1
    if args.result:
        Path(args.result).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
