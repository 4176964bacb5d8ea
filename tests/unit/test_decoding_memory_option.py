"""The capture option that raises PostgreSQL's logical_decoding_work_mem for the sessions that
decode a window (behaviour on a real server: tests/integration/postgres/test_sql_window.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from airflow_provider_cdc.captures.postgres import PostgresCapture
from airflow_provider_cdc.captures.yugabyte import YugabyteCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.planning.spec import CaptureOptions

COMMON = {"tables": ["public.t"], "topic_prefix": "shop", "sink_path": "/tmp/lake"}


@pytest.mark.parametrize("bad", [1024, 64 * 1024 - 1, True, 1.5, 65536.0, "256MB", 2 * 1024**3, 2**41])
def test_a_value_outside_postgresqls_bounds_is_refused(bad):
    with pytest.raises(CdcConfigurationError, match="decoding_work_mem_bytes"):
        CaptureOptions(decoding_work_mem_bytes=bad)


def test_the_value_survives_the_job_spec_file():
    options = CaptureOptions(decoding_work_mem_bytes=96 * 1024 * 1024)
    assert CaptureOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options


def test_postgresql_captures_raise_it_by_default_and_a_bare_spec_does_not():
    postgres = PostgresCapture(postgres_conn_id="pg", **COMMON)
    assert postgres.capture_options().decoding_work_mem_bytes == 256 * 1024 * 1024
    assert replace(postgres, decoding_work_mem_bytes=None).capture_options().decoding_work_mem_bytes is None
    assert CaptureOptions().decoding_work_mem_bytes is None
    assert CaptureOptions.from_dict({}).decoding_work_mem_bytes is None  # a spec written before the option


def test_yugabytedb_captures_leave_it_unset_and_refuse_a_value():
    assert YugabyteCapture(yugabytedb_conn_id="yb", **COMMON).capture_options().decoding_work_mem_bytes is None
    with pytest.raises(CdcConfigurationError, match="YugabyteDB"):
        YugabyteCapture(yugabytedb_conn_id="yb", decoding_work_mem_bytes=1 << 26, **COMMON).validate_source()
