"""A killed query extraction (review finding 11): ``on_kill`` during the run ends it, and nothing
is saved after a kill, also during the supervisor's 5 s before its SIGKILL. (The window tasks'
kills run end to end in tests/integration/test_operators.py.)"""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.reading.query_extract import QueryOffset
from airflow_provider_cdc.operators.query_extract import PostgresQueryExtractOperator


def test_on_kill_ends_the_run_and_nothing_is_saved_after_it(tmp_path):
    from airflow.sdk.exceptions import AirflowTaskTerminated

    operator = PostgresQueryExtractOperator(
        task_id="extract",
        postgres_conn_id="src",
        table="public.orders",
        cursor_column="updated_at",
        topic_prefix="orders_q",
        sink_path=str(tmp_path),
    )
    operator.on_kill()  # not running (e.g. after the run ended): nothing to end
    operator._executing = True  # what execute sets while the window runs
    with pytest.raises(AirflowTaskTerminated, match="was killed during its run"):
        operator.on_kill()
    offset = QueryOffset("orders_q", TableRef("public", "orders"), "updated_at")
    with pytest.raises(AirflowTaskTerminated, match="not saving the offset"):
        operator._save(None, offset, None)  # type: ignore[arg-type]  # refused before the store is used
