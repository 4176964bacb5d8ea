"""The current-state operator: folds the committed windows into one row per key, per table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.planning.runs import state_target
from airflow_provider_cdc.cdc.sinks.path_checks import check_writable
from airflow_provider_cdc.operators.base import CdcCaptureOperator, fail_fast_on_terminal_errors, unmappable_error
from airflow_provider_cdc.utils.runs import run_interval
from airflow_provider_cdc.version_compat import AirflowSkipException, Context


class CdcCurrentStateOperator(CdcCaptureOperator):
    """Maintain current-state tables of captured tables from the committed change windows.

    Each run folds the windows committed since the last run into the state (deletes remove rows,
    key changes move them, truncates clear the table, unchanged TOAST values are kept); running
    it again without new windows changes nothing. With ``as_of_window`` it rebuilds the state at
    that committed window instead (for backfills), leaving the current version where it is.

    :param capture: the capture
    :param state_path: base directory (or Hadoop URI) of the state tables; not templated (it names
        the outlets, which Airflow needs at parse)
    :param tables: subset of the capture's tables (default: all)
    :param as_of_window: a committed window id (e.g. ``"0000000042"``); templated
    :param state_engine: ``"auto"`` (default: Arrow in the task's process when the refresh is
        small, see docs/operators.md; Spark above), ``"arrow"`` (never a JVM: the fold in the
        worker's memory) or ``"spark"`` (as before: embedded, or ``spark-submit`` with
        ``spark_conn_id``)
    """

    template_fields: Sequence[str] = ("as_of_window",)
    unmappable: ClassVar[tuple[str, ...]] = ("capture", "state_path", "tables")  # the outlets derive from them

    @classmethod
    def _partial_outlets(cls, kwargs: dict[str, Any]) -> list[Any] | None:
        from airflow_provider_cdc.utils.assets import state_outlets

        if "state_path" not in kwargs:
            raise unmappable_error(cls, ["state_path"])
        capture, tables = kwargs["capture"], kwargs.get("tables")
        chosen = None if tables is None else tuple(TableRef.coerce(t, capture.NAMES) for t in tables)
        return state_outlets(capture, kwargs["state_path"], chosen)

    def __init__(
        self,
        *,
        capture: Capture,
        state_path: str,
        tables: Sequence[str] | None = None,
        as_of_window: str | int | None = None,
        state_engine: str = "auto",
        **kwargs: Any,
    ) -> None:
        from airflow_provider_cdc.cdc.sinks.path_checks import check_path_setting
        from airflow_provider_cdc.utils.assets import state_outlets

        if state_engine not in ("auto", "arrow", "spark"):  # checked at parse; no pyarrow import here
            raise CdcConfigurationError(f"state_engine must be 'auto', 'arrow' or 'spark', not {state_engine!r}")
        # Fixed at parse, like sink_path: it names the outlets (no Jinja, relative path or '%').
        state_path = check_path_setting(state_path, "state_path")
        if isinstance(capture, Capture):
            from airflow_provider_cdc.cdc.sinks.formats import check_iceberg_catalog

            has_catalog = bool(capture.table_catalog) or capture.table_catalog_conn_id is not None
            check_iceberg_catalog(capture.sink_format, state_path, "state_path", has_catalog)
        chosen = None if tables is None else tuple(TableRef.coerce(t, capture.NAMES) for t in tables)
        if isinstance(capture, Capture):
            kwargs.setdefault("outlets", state_outlets(capture, state_path, chosen))
        super().__init__(capture=capture, **kwargs)
        self.state_path = state_path
        self.tables = chosen
        unknown = [str(r) for r in self.tables or () if capture.table_refs and r not in capture.table_refs]
        if unknown:
            raise CdcConfigurationError(f"tables {unknown} are not captured by {capture.topic_prefix!r}")
        self.as_of_window = as_of_window
        self.state_engine = state_engine
        self._ran = False  # see CdcLandingOperator: what this task object's run did, for its lineage
        self._state_results: list[dict[str, Any]] = []

    def execute(self, context: Context) -> list[dict[str, Any]]:
        self._ran, self._state_results = True, []  # for the lineage: nothing folded until the job returns
        with fail_fast_on_terminal_errors(self.capture), self._object_store():
            return self._fold(context)

    def _fold(self, context: Context) -> list[dict[str, Any]]:
        from airflow_provider_cdc import spark_runner
        from airflow_provider_cdc.cdc.planning.spec import StateJobSpec
        from airflow_provider_cdc.cdc.sinks.object_store import is_object_store

        capture = self.capture
        if is_object_store(self.state_path):  # before the job: a store it cannot write fails here, clearly
            check_writable(self.state_path, "state_path")
        as_of = None if self.as_of_window in (None, "") else int(str(self.as_of_window))
        if as_of is None:
            as_of = self._as_of_for_past_run(context)
        tables = self.tables
        if tables is None:
            with fail_fast_on_terminal_errors(capture):
                tables = capture.resolve_tables_now()
        spec = StateJobSpec(
            topic_prefix=capture.topic_prefix,
            sink_path=capture.sink_path,
            state_path=self.state_path,
            topics=tuple(
                (topic.name, topic.directory)
                for topic in (Topic.for_table(capture.topic_prefix, r.schema, r.name) for r in tables)
            ),
            as_of_seq=as_of,
            spark=capture.spark_options(),
            sink_format=capture.sink_format,
            table_catalog=(options := capture.run_options()).table_catalog,
            table_catalog_secret_property=options.table_catalog_secret_property,
            table_catalog_secret=options.table_catalog_secret,
            object_store=options.object_store,
            state_engine=self.state_engine,
        )
        # Decided here, before anything starts a JVM: an Arrow-sized refresh runs in this process
        # (with spark_conn_id too: no spark-submit), a larger one in Spark as before.
        from dataclasses import replace

        from airflow_provider_cdc.cdc.state.arrow import ARROW, choose_engine

        engine, size = choose_engine(spec)
        self.log.info("current-state engine: %s%s", engine, "" if size is None else f" ({size})")
        spec = replace(spec, state_engine=engine)
        with self._running():
            if capture.spark_conn_id is None or engine == ARROW:
                from airflow_provider_cdc.cdc.state.jobs import run_state_job

                results = run_state_job(spec)
            else:
                try:
                    results = spark_runner.submit(
                        spec.to_json(),
                        name=f"cdc-state-{capture.topic_prefix}",
                        secrets=spark_runner.state_secrets(spec),
                        spark_conn_id=capture.spark_conn_id,
                        conf=dict(capture.spark_conf),
                        application=capture.spark_application,
                        on_start=self._track_job,
                    )
                finally:
                    self._spark_job = None  # ended (or stopped): a later kill has nothing of it to stop
        for result in results:
            self.log.info(
                "%s: %s (window %s, %d rows)", result["topic"], result["action"], result["window_id"], result["rows"]
            )
        if engine == ARROW:
            import sys

            self.log.info("folded on Arrow in the task's process (pyspark imported: %s)", "pyspark" in sys.modules)
        from airflow_provider_cdc.utils.assets import emit_state_events

        via_alias = self.tables is None and not capture.tables_known_at_parse
        emit_state_events(context, capture, self.state_path, results, tables, via_alias=via_alias)
        self._state_tables = tuple(tables)
        self._state_results = results
        return results

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (when its provider is installed): the topics this run folded in, the
        current-state tables it changed out; nothing for a skipped run or an unchanged state."""
        from airflow_provider_cdc.utils.lineage import state_lineage

        tables = getattr(self, "_state_tables", None) or self.tables or self.capture.table_refs
        with self._after_run():
            return state_lineage(self, tables, task_instance)

    def _as_of_for_past_run(self, context: Context) -> int | None:
        """A backfill, or a re-run of a past run: the window its state is rebuilt "as of" (the
        current version stays); None for every other run (the current state)."""
        from airflow_provider_cdc.cdc.sinks.reader import committed_windows

        interval = run_interval(context)
        if interval is None:
            return None
        target = state_target(committed_windows(self.capture.sink_path, self.capture.topic_prefix), interval)
        if target.skip:
            raise AirflowSkipException(target.reason)
        self.log.info("%s", target.reason)
        return None if target.as_of is None else target.as_of.window.seq


__all__ = ["CdcCurrentStateOperator"]
