"""The example DAG, as shipped, runs green through dag.test() (what the demo does)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.state.jobs import read_state
from airflow_provider_cdc.testing import shop
from tests.conftest import ROOT
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay, source_rows, spark_rows

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

KEYS = {"public.customers": ["id"], "public.orders": ["id"], "public.order_items": ["order_id", "line_no"]}


def load_example_dag():
    path = ROOT / "dags" / "examples" / "postgres_cdc_hourly.py"
    spec = importlib.util.spec_from_file_location("postgres_cdc_hourly", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag, module.capture


def example_setup(db, tmp_path, monkeypatch):
    """The shop database, the example DAG's environment, and the DAG with failures recorded."""
    from airflow.models import Variable

    with db.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn)
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_DB", db.cluster.airflow_uri(db.name))
    monkeypatch.setenv("CDC_EXAMPLE_SINK_PATH", str(tmp_path))
    monkeypatch.setenv("CDC_EXAMPLE_STATE_PATH", str(tmp_path / "state"))
    Variable.delete("cdc_offset__shop")
    dag, capture = load_example_dag()
    errors: dict = {}
    dag.default_args["on_failure_callback"] = af.failure_recorder(errors)
    return dag, capture, errors


def test_example_dag_three_hourly_runs(db15, airflow_db, spark, tmp_path, monkeypatch, capfd):
    from airflow.models import Variable

    db = db15
    dag, capture, errors = example_setup(db, tmp_path, monkeypatch)
    lineage = record_run_lineage(dag)
    results = []
    keep_size_warnings = []
    for hour in range(3):
        if hour:
            with db.connect() as conn:
                shop.mutate(conn, round_no=hour)
        capfd.readouterr()
        lineage.clear()
        results.append(af.run(dag, hour, errors=errors))
        check_run_lineage(hour, dict(lineage))
        assert results[-1].state == "success", errors
        printed = capfd.readouterr()  # dag.test() prints the task logs
        keep_size_warnings.append([line for line in printed.out.splitlines() if "keep_size is -1" in line])
    # The test cluster keeps WAL without limit: said once, by the setup that created the slot.
    assert [len(lines) for lines in keep_size_warnings] == [1, 0, 0], keep_size_warnings
    assert "warning" in keep_size_warnings[0][0] and "CdcSetupOperator" in keep_size_warnings[0][0]
    assert [r.tasks["snapshot"] for r in results] == ["success", "skipped", "skipped"]
    windows = [r.xcom["capture_window"] for r in results]
    assert [w["from_lsn"] for w in windows[1:]] == [w["to_lsn"] for w in windows[:-1]]
    status = db.slot_status(capture.resolved_slot_name)
    assert status.confirmed_flush_lsn == Lsn(windows[-1]["to_lsn"])
    assert [r.tasks["current_state"] for r in results] == ["success"] * 3
    health = [r.xcom["slot_health"] for r in results]
    assert all(h["healthy"] and h["metrics"]["wal_status"] == "reserved" for h in health)
    assert health[-1]["metrics"]["confirmed_flush_lsn"] == windows[-1]["to_lsn"]
    check_asset_events(dag, tmp_path, windows)
    check_lineage(dag, tmp_path, db)
    lineage.clear()  # the last run cleared and run again: it reads and writes nothing
    assert af.run(dag, 2, errors=errors).state == "success", errors
    assert lineage == {t: ([], []) for t in ("snapshot", "capture_window", "current_state")} | {
        f"{t}@start": ([], []) for t in ("snapshot", "capture_window", "current_state")
    }
    with db.connect() as conn:
        for table, keys in KEYS.items():
            source = source_rows(conn, table, keys)
            assert_same_state(replay(events_of(tmp_path, "shop", table), keys), source)
            schema, name = table.split(".")
            state = read_state(
                spark,
                state_path=str(tmp_path / "state"),
                topic_prefix="shop",
                topic=Topic.for_table("shop", schema, name),
            )
            assert_same_state(spark_rows(state, keys), source)
    Variable.delete("cdc_offset__shop")


def check_asset_events(dag, sink_root, windows) -> None:
    """Every landed dataset is an outlet Asset with its directory's URI; each window run's events
    (in Airflow's metadata database) carry the window, its bounds and what landed in each."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    lake = f"file://{sink_root}"
    topics = ["shop.public.customers", "shop.public.orders", "shop.public.order_items"]
    window_uris = [f"{lake}/{t}" for t in topics] + [f"{lake}/shop.transaction", f"{lake}/shop.message"]
    for task_id in ("snapshot", "capture_window"):
        assert sorted(a.uri for a in dag.get_task(task_id).outlets) == sorted(window_uris)
    state_uris = [f"file://{sink_root}/state/{t}" for t in topics]
    assert sorted(a.uri for a in dag.get_task("current_state").outlets) == sorted(state_uris)
    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetEvent.source_task_id, AssetEvent.extra)
            .join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
            .where(AssetEvent.source_dag_id == dag.dag_id)
            .order_by(AssetEvent.id)
        ).all()
    by_task: dict[str, list] = {}
    for uri, task_id, extra in rows:
        by_task.setdefault(task_id, []).append((uri, extra))
    assert len(by_task["snapshot"]) == len(window_uris)  # one run snapshotted
    assert len(by_task["capture_window"]) == len(window_uris) * len(windows)
    assert len(by_task["current_state"]) == len(state_uris) * len(windows)
    for n, window in enumerate(windows):
        events = dict(by_task["capture_window"][n * len(window_uris) : (n + 1) * len(window_uris)])
        for topic in topics:
            extra = events[f"{lake}/{topic}"]
            assert extra["window_id"] == window["window_id"] and extra["replayed"] is False
            assert (extra["from_lsn"], extra["to_lsn"]) == (window["from_lsn"], window["to_lsn"])
            assert extra["events"] == sum(window["events"].get(topic, {}).values())
        assert events[f"{lake}/shop.transaction"]["transactions"] == window["transactions"]
    assert sum(e["events"] for u, e in by_task["capture_window"] if u.endswith("order_items")) > 0
    assert all("password" not in str(extra) for _, _, extra in rows)


def record_run_lineage(dag) -> dict[str, tuple[list[str], list[str]]]:
    """What each run reports to OpenLineage, as the provider's listener reads it: its own
    ExtractorManager on the task object that ran, right after it ran (the task's success or skip
    callback runs on that object just before the listener)."""
    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.utils.state import TaskInstanceState

    seen: dict[str, tuple[list[str], list[str]]] = {}

    def short(dataset) -> str:  # public.orders for a source table, shop.public.orders for a dataset
        if dataset.namespace.startswith("postgres://"):
            return dataset.name.split(".", 1)[1]
        return dataset.name.rsplit("/", 1)[-1]

    def record(context) -> None:
        skipped = context.get("exception") is not None
        state = TaskInstanceState.SKIPPED if skipped else TaskInstanceState.SUCCESS
        found = ExtractorManager().extract_metadata(context["dag_run"], context["task"], state, context["ti"])
        seen[context["ti"].task_id] = (sorted(map(short, found.inputs)), sorted(map(short, found.outputs)))

    def record_start(context) -> None:  # the START event, before the run decided anything
        found = ExtractorManager().extract_metadata(
            context["dag_run"], context["task"], TaskInstanceState.RUNNING, context["ti"]
        )
        seen[f"{context['ti'].task_id}@start"] = (sorted(map(short, found.inputs)), sorted(map(short, found.outputs)))

    for task_id in ("snapshot", "capture_window", "current_state"):
        dag.get_task(task_id).on_execute_callback = [record_start]
        dag.get_task(task_id).on_success_callback = [record]
        dag.get_task(task_id).on_skipped_callback = [record]
    return seen


def check_run_lineage(hour: int, seen: dict) -> None:
    """Only what each run did (issue 30, item 2): the snapshot of run 0 read every table and landed
    their topics (no transactions); the window after it landed nothing; later snapshots are
    skipped; later windows read and land every table's changes, with their transactions."""
    topics = sorted(f"shop.{t}" for t in KEYS)
    for task_id in ("snapshot", "capture_window", "current_state"):  # START claims nothing
        assert seen.pop(f"{task_id}@start") == ([], []), f"{task_id}: the START event claimed datasets"
    if hour == 0:
        assert seen["snapshot"] == (sorted(KEYS), topics)
        assert seen["capture_window"] == ([], []), "a window that landed nothing read and wrote nothing"
    else:
        assert seen["snapshot"] == ([], []), "a skipped snapshot read and wrote nothing"
        assert seen["capture_window"] == (sorted(KEYS), sorted([*topics, "shop.transaction"]))
    assert seen["current_state"] == (topics, topics)  # a new version of each state table


def check_lineage(dag, sink_root, db) -> None:
    """OpenLineage's own extractor manager finds the operators' lineage after the runs: the
    source tables (spec naming) in, the landed datasets (the Assets' URIs) out, each output with
    the schema its Parquet files were written with."""
    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.utils.state import TaskInstanceState

    from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook

    manager = ExtractorManager()
    info = PostgresCdcHook("shop_db").connection_info
    run = SimpleNamespace(run_id="lineage-check")
    window = manager.extract_metadata(run, dag.get_task("capture_window"), TaskInstanceState.SUCCESS, None)
    assert sorted((d.namespace, d.name) for d in window.inputs) == sorted(
        (f"postgres://{info.host}:{info.port}", f"{info.dbname}.{t}") for t in KEYS
    )
    outputs = {d.name.rsplit("/", 1)[-1]: d for d in window.outputs}
    assert sorted(outputs) == sorted(
        ["shop.public.customers", "shop.public.orders", "shop.public.order_items", "shop.transaction", "shop.message"]
    )
    assert {d.namespace for d in window.outputs} == {"file"}
    orders = {f.name: f for f in outputs["shop.public.orders"].facets["schema"].fields}
    assert {"before", "after", "source", "op", "ts_ms", "transaction"} <= set(orders)
    with db.connect() as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'orders'"
            ).fetchall()
        ]
    assert sorted(f.name for f in orders["after"].fields) == sorted(columns)
    assert "status" in {f.name for f in outputs["shop.transaction"].facets["schema"].fields}
    state = manager.extract_metadata(run, dag.get_task("current_state"), TaskInstanceState.SUCCESS, None)
    assert sorted(d.name for d in state.outputs) == sorted(f"{sink_root}/state/shop.{t}" for t in KEYS)
    assert all("schema" in d.facets for d in state.outputs + state.inputs)
    assert "password" not in repr(window) + repr(state)
