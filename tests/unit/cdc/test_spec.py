from __future__ import annotations

import dataclasses
import json

from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.columns import ColumnRules
from airflow_provider_cdc.cdc.planning.gaps import CaptureGap
from airflow_provider_cdc.cdc.planning.spec import CaptureOptions, StateJobSpec, job_kind
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.cdc.sources.postgres.types import ValueModes


def test_job_spec_round_trips_without_the_password():
    spec = PostgresJobSpec(
        topic_prefix="shop",
        connection=PgConnectionInfo("db", 5432, "shop", "cdc", password="s3cret", options=(("sslmode", "require"),)),
        slot_name="s",
        publication_name="p",
        tables=(TableRef("public", "a"), TableRef("Odd", "t.b")),
        window=Window(3, "stream", Lsn(10), Lsn(20), 5),
        sink_path="s3a://lake/cdc",
        previous_commit_lsn=Lsn(9),
        options=CaptureOptions(max_changes_per_chunk=7),
        events=EventSettings(
            modes=ValueModes(decimal="string", time_precision="adaptive"),
            columns=ColumnRules.from_options(
                exclude=["public\\.a\\.x"], debezium_properties={"column.mask.with.3.chars": "public.a.y"}
            ),
            message_prefix_include=("orders",),
        ),
    )
    text = spec.to_json()
    assert "s3cret" not in text and json.loads(text)["connection"]["password_env"] == "AIRFLOW_CDC_SOURCE_PASSWORD"
    back = PostgresJobSpec.from_json(text)
    assert back == spec and back.connection.password is None
    assert job_kind(text) == "window"
    gap = CaptureGap("wal_lost", "WAL removed", "0000000002", "0/14", "0/1E", "lost", 123)
    with_gap = dataclasses.replace(spec, connection=back.connection, gap=gap)
    assert PostgresJobSpec.from_json(with_gap.to_json()) == with_gap


def test_state_spec_round_trips():
    spec = StateJobSpec("shop", "/lake", "/state", (("shop.public.a", "shop.public.a"),), as_of_seq=4)
    assert StateJobSpec.from_json(spec.to_json()) == spec
    assert job_kind(spec.to_json()) == "current_state"
