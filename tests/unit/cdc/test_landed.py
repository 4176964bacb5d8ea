"""The landed datasets' URIs: one per dataset, stable, and distinct wherever the data is."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.sinks.landed import (
    CAPTURE_GAPS,
    CHANGE_EVENTS,
    CURRENT_STATE,
    MESSAGES,
    TRANSACTIONS,
    capture_datasets,
    gap_dataset,
    state_datasets,
)


def test_a_local_sink_lands_file_uris_of_the_topic_directories(tmp_path):
    sink = tmp_path / "lake"
    found = capture_datasets(str(sink), "shop", [TableRef("public", "orders")], messages=True)
    assert [(d.kind, d.topic, d.uri) for d in found] == [
        (CHANGE_EVENTS, "shop.public.orders", f"file://{sink}/shop.public.orders"),
        (TRANSACTIONS, "shop.transaction", f"file://{sink}/shop.transaction"),
        (MESSAGES, "shop.message", f"file://{sink}/shop.message"),
    ]
    assert found[0].table == TableRef("public", "orders")
    assert (found[0].namespace, found[0].path) == ("file", f"{sink}/shop.public.orders")
    assert gap_dataset(str(sink), "shop").kind == CAPTURE_GAPS


def test_a_relative_sink_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (found,) = state_datasets("state/", "shop", [TableRef("public", "orders")])
    assert found.kind == CURRENT_STATE
    assert found.uri == f"file://{tmp_path}/state/shop.public.orders"


def test_hadoop_s3_schemes_are_named_s3():
    for scheme in ("s3a", "s3n", "s3"):
        (found,) = state_datasets(f"{scheme}://bucket/cdc/", "shop", [TableRef("public", "t")])
        assert found.uri == "s3://bucket/cdc/shop.public.t"
        assert (found.namespace, found.path) == ("s3://bucket", "/cdc/shop.public.t")


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)


@given(st.lists(st.tuples(names, names), min_size=1, max_size=6, unique=True))
def test_distinct_tables_never_share_a_uri(tables):
    refs = [TableRef(schema, name) for schema, name in tables]
    uris = [d.uri for d in capture_datasets("/lake", "shop", refs)]
    assert len(set(uris)) == len(uris)
    assert all("/" not in u[len("file:///lake/") :] for u in uris)  # one directory level each
