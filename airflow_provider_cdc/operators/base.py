"""The base of every operator that acts on one capture, whatever its source.

:class:`CdcCaptureOperator` holds the capture, makes its object-store access active for the run,
refuses mapping what the outlets derive from, and stops what the task started when Airflow kills
it. :func:`fail_fast_on_terminal_errors` turns the engine's terminal errors (bad configuration,
lost slot, inconsistent offsets) into failures without retries; transient ones (a dropped
connection) are left to Airflow's retries.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcError
from airflow_provider_cdc.version_compat import AirflowFailException, BaseOperator


@contextmanager
def fail_fast_on_terminal_errors(capture: Capture | None = None) -> Iterator[None]:
    """Terminal engine errors fail the task without retries; a source session that died mid-run
    becomes a (retryable) CdcTransientError that says so; others propagate unchanged.

    The replacement carries the original's message and traceback (where the engine raised it)
    and is not chained to it, so the task log shows one traceback, not a "direct cause" pair.
    """
    from airflow_provider_cdc.cdc.basics.errors import CdcTransientError

    lost = capture.connection_errors() if capture is not None else _postgres_connection_errors()
    source = capture.SOURCE_NAME if capture is not None else "PostgreSQL"
    try:
        yield
    except CdcError as exc:
        if exc.terminal:
            raise AirflowFailException(f"{type(exc).__name__}: {exc}").with_traceback(exc.__traceback__) from None
        raise
    except lost as exc:  # a session of the run died: server restart, network, kill
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise CdcTransientError(
            f"lost the connection to {source} during the run ({type(exc).__name__}: {detail}); "
            "nothing past the stored offset was acknowledged, a retry continues from there"
        ).with_traceback(exc.__traceback__) from None


def _spark_runner() -> Any:
    """:mod:`airflow_provider_cdc.spark_runner`, imported when a task runs, not at DAG parse."""
    from airflow_provider_cdc import spark_runner

    return spark_runner


def _interrupt_behind(exc: BaseException) -> BaseException | None:
    """The timeout (or other interrupt: not an Exception) that ``exc`` is or that it hides.

    Airflow's timeout is raised in the main thread, usually inside the py4j call waiting for the
    running Spark job; PySpark's cleanup then makes another call on that connection, which can
    fail with a Py4JError that has the timeout as context (spark_runner.cancel_before_timeout
    drops the interrupted call first; this is the fallback)."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        if not isinstance(seen, Exception):
            return seen
        seen = seen.__context__
    return None


def _postgres_connection_errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.OperationalError,)


class CdcCaptureOperator(BaseOperator):
    """Base of the operators that act on one capture (any source).

    Dynamic task mapping: give the capture (and what the outlets derive from) in ``.partial()``
    and map the other arguments. The outlets are derived there, as for an unmapped task; mapping
    the capture itself is refused: its outlets could not be known when the DAG is parsed, and its
    settings would be stored in the serialized DAG or in XCom.
    """

    ui_color = "#d4ecff"
    #: Arguments that must be given in ``.partial()``, never mapped.
    unmappable: ClassVar[tuple[str, ...]] = ("capture",)

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:  # type: ignore[override]
        """``BaseOperator.partial``, with the outlets an unmapped task would have; refuses to map
        what they derive from (see the class docstring)."""
        if not isinstance(kwargs.get("capture"), Capture):
            raise unmappable_error(cls, ["capture"])
        outlets = cls._partial_outlets(kwargs)
        if outlets is not None:
            kwargs.setdefault("outlets", outlets)
        return _CapturePartial(super().partial(**kwargs), cls, kwargs)

    @classmethod
    def _partial_outlets(cls, kwargs: dict[str, Any]) -> list[Any] | None:
        return None

    def get_openlineage_facets_on_start(self) -> Any:
        """OpenLineage START event: no datasets (the COMPLETE event reports what the run did)."""
        from airflow_provider_cdc.utils.lineage import start_lineage

        return start_lineage(self)

    def on_kill(self) -> None:
        """Stop what this task started when Airflow kills it ("mark failed", its supervisor's
        SIGTERM; an ``execution_timeout`` stops it as it unwinds the run): a job submitted with
        ``spark_conn_id`` by killing every process ``spark-submit`` started (in client mode the
        Python driver, which holds the replication session), then as ``SparkSubmitOperator.on_kill``
        does (the hook kills ``spark-submit`` and, on a cluster, the driver); the in-process
        session's Spark jobs, cancelled from another thread (the main thread is usually inside a
        py4j call, which must not be re-entered), and that call dropped. A run still executing
        then ends where it is: nothing is saved or acknowledged after a kill, the capture lock and
        the source session are released as the run unwinds (by the server, if the process is
        killed outright), and the next run continues from the last committed window (a window the
        sink committed is rolled forward, once).
        """
        self._killed = True
        if not getattr(self, "_executing", False):
            return
        try:
            self._stop_jobs()
            if self.capture.spark_conn_id is None:
                _spark_runner().drop_interrupted_call()
        finally:  # a SIGTERM during the run: end it here, whatever stopping the jobs did
            raise self._terminated()

    def _terminated(self) -> BaseException:
        from airflow.sdk.exceptions import AirflowTaskTerminated

        return AirflowTaskTerminated(
            f"task {self.task_id!r} was killed during its run: nothing past the last committed window "
            "was saved or acknowledged; the next run continues from there"
        )

    def _stop_jobs(self) -> None:
        """Stop the Spark work of this run, if any (best effort: never raises)."""
        job, self._spark_job = getattr(self, "_spark_job", None), None
        try:
            if job is not None:
                self.log.warning("stopping the submitted Spark job")
                _spark_runner().kill_submitted(job)
            elif self.capture.spark_conn_id is None:
                self.log.warning("cancelling the in-process Spark jobs")
                _spark_runner().cancel_embedded()
        except Exception as exc:
            self.log.warning("could not stop the run's Spark job: %s", exc)

    @contextmanager
    def _running(self) -> Iterator[None]:
        """Mark the run in progress, for :meth:`on_kill`."""
        self._killed, self._executing, self._spark_job = False, True, None
        try:
            if self.capture.spark_conn_id is None:
                with _spark_runner().cancel_before_timeout(lambda: self._executing):
                    yield
            else:
                yield
        except BaseException as exc:
            if self._killed:  # on_kill stopped the jobs; PySpark's cleanup may have hidden its exception
                from airflow.sdk.exceptions import AirflowTaskTerminated

                if not isinstance(exc, AirflowTaskTerminated):
                    raise self._terminated() from exc
                raise
            # An execution_timeout (or another interrupt) unwinds execute before Airflow calls
            # on_kill, which then finds no run: stop what may still run (a submitted job is
            # stopped by spark_runner.submit itself). After an error of the job itself there is
            # nothing left to stop.
            interrupt = _interrupt_behind(exc)
            if interrupt is None:
                raise
            self._stop_jobs()
            if interrupt is not exc:  # PySpark's cleanup hid it: report the timeout
                raise interrupt.with_traceback(interrupt.__traceback__) from None
            raise
        finally:
            self._executing, self._spark_job = False, None

    def _track_job(self, hook: Any) -> None:
        """Remember the submitted job's hook (for :meth:`on_kill`) before it starts."""
        self._spark_job = hook

    def _check_not_killed(self, action: str) -> None:
        if getattr(self, "_killed", False):
            from airflow.sdk.exceptions import AirflowTaskTerminated

            raise AirflowTaskTerminated(f"task {self.task_id!r} was killed: not {action}")

    def __init__(self, *, capture: Capture, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(capture, Capture):
            raise CdcConfigurationError(
                f"capture must be a capture object (e.g. PostgresCapture), got {type(capture).__name__}"
            )
        self.capture = capture

    def hook(self) -> Any:
        return self.capture.hook()  # type: ignore[attr-defined]

    @contextmanager
    def _object_store(self) -> Iterator[None]:
        """The capture's object-store access (``object_store_conn_id``, read now) active for the
        block: every store client the task builds takes it (commit log, readers, lake tables, jobs
        run in the task's process); a submitted job gets it through its spec and environment. Kept
        for the lineage the task reports after ``execute``."""
        from airflow_provider_cdc.cdc.sinks import object_store

        self._store_access = self.capture.object_store_access()
        with object_store.using(self._store_access):
            yield

    @contextmanager
    def _after_run(self) -> Iterator[None]:
        """The access of the run that just ended, for the lineage read after ``execute``."""
        from airflow_provider_cdc.cdc.sinks import object_store

        with object_store.using(getattr(self, "_store_access", None)):
            yield


def unmappable_error(operator: type, names: Sequence[str]) -> CdcConfigurationError:
    listed = ", ".join(repr(n) for n in names)
    return CdcConfigurationError(
        f"{operator.__name__}: {listed} cannot be mapped: give it in .partial(), and map the other arguments "
        "with .expand(). The task's outlets (the datasets it lands) are derived from it when the DAG is "
        "parsed, and a capture's settings (which may hold credentials, e.g. in spark_conf) must not be "
        "stored in the serialized DAG or in XCom. For several captures, write one task per capture."
    )


class _CapturePartial:
    """What ``.partial()`` of a capture operator returns: Airflow's ``OperatorPartial``, whose
    ``expand`` / ``expand_kwargs`` first refuse mapping the operator's ``unmappable`` arguments."""

    def __init__(self, partial: Any, operator: type[CdcCaptureOperator], given: dict[str, Any]) -> None:
        self._partial = partial
        self._operator = operator
        self._given = set(given)

    def expand(self, **mapped_kwargs: Any) -> Any:
        self._refuse([n for n in self._operator.unmappable if n in mapped_kwargs])
        return self._partial.expand(**mapped_kwargs)

    def expand_kwargs(self, kwargs: Any, *, strict: bool = True) -> Any:
        if isinstance(kwargs, (list, tuple)) and all(isinstance(k, dict) for k in kwargs):
            self._refuse([n for n in self._operator.unmappable if any(n in k for k in kwargs)])
        else:  # an XCom: any key could come from it at run time
            self._refuse([n for n in self._operator.unmappable if n not in self._given])
        return self._partial.expand_kwargs(kwargs, strict=strict)

    def _refuse(self, names: list[str]) -> None:
        if names:
            self._partial._expand_called = True  # no "was never mapped" warning on top of the error
            raise unmappable_error(self._operator, names)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._partial, name)

    def __repr__(self) -> str:
        return repr(self._partial)


__all__ = ["CdcCaptureOperator", "fail_fast_on_terminal_errors", "unmappable_error"]
