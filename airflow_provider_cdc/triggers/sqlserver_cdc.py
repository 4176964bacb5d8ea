"""Trigger that waits until SQL Server's capture job has processed a data interval."""

from __future__ import annotations

import math
import threading
from datetime import datetime
from typing import Any

from airflow_provider_cdc.hooks.sqlserver_cdc import connection_info_from
from airflow_provider_cdc.triggers.polling import DEFAULT_CHECK_TIMEOUT, ReadinessPollingTrigger


class SqlServerCdcChangesTrigger(ReadinessPollingTrigger):
    """Polls the capture job's position every ``poll_interval``; fires ``{"status": "success"}``
    once it passed ``until`` (ISO-8601, UTC; None: once it captured anything), ``{"status":
    "error"}`` when CDC is off, the database cannot be reached or does not answer within
    ``check_timeout`` seconds. pyodbc has no async API: each poll runs in a thread (see
    :mod:`.polling`), its login bounded by ODBC's login timeout, its queries by ODBC's query
    timeout and by cancelling them at ``check_timeout``, so the thread ends by itself."""

    def __init__(
        self,
        sqlserver_conn_id: str,
        until: str | None,
        poll_interval: float = 60.0,
        driver: str | None = None,
        server_time_zone: str = "UTC",
        check_timeout: float = DEFAULT_CHECK_TIMEOUT,
    ):
        super().__init__()
        self.sqlserver_conn_id = sqlserver_conn_id
        self.until = until
        self.poll_interval = poll_interval
        self.driver = driver
        self.server_time_zone = server_time_zone
        self.check_timeout = check_timeout

    @property
    def conn_id(self) -> str:
        return self.sqlserver_conn_id

    @property
    def reading(self) -> str:  # type: ignore[override]
        return "the capture job's position"

    def connection_info(self, conn: Any) -> Any:  # in the event loop: imported with the module
        return connection_info_from(conn, self.driver)

    def check(self, info: Any) -> Any:
        from airflow_provider_cdc.cdc.sources.sqlserver.connection import connect
        from airflow_provider_cdc.cdc.sources.sqlserver.pending import capture_job_readiness

        until = None if not self.until else datetime.fromisoformat(self.until)
        timeout = max(1, math.ceil(self.check_timeout))
        # The query timeout too: against a server that accepts the login and then stalls, this
        # thread must end by itself (the trigger stops waiting for it, but cannot stop it).
        conn = connect(info, login_timeout=timeout, query_timeout=timeout)
        watched = _CancelledAfter(conn, self.check_timeout)
        try:
            return capture_job_readiness(watched, until, self.server_time_zone)
        except Exception as exc:
            if watched.expired:
                raise TimeoutError(
                    f"the server at {info.describe()} did not answer within {self.check_timeout:g} s (check_timeout)"
                ) from exc
            raise
        finally:
            watched.close()


class _CancelledAfter:
    """A pyodbc connection as the engine's readers use it (``cursor()``), whose cursors are
    cancelled once ``seconds`` have passed (ODBC's ``SQLCancel``: pyodbc's ``Cursor.cancel``,
    made to be called from another thread). The bound for every driver: pyodbc's query timeout
    needs a connection attribute some drivers refuse (see ``connect``)."""

    def __init__(self, conn: Any, seconds: float) -> None:
        self._conn = conn
        self._cursors: list[Any] = []
        self._lock = threading.Lock()
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def cursor(self) -> Any:
        with self._lock:
            if self.expired:  # past the deadline: no new statement
                raise TimeoutError("check_timeout passed")
            cursor = self._conn.cursor()
            self._cursors.append(cursor)
            return cursor

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            cursors = list(self._cursors)
        for cursor in cursors:
            try:
                cursor.cancel()
            except Exception:  # a cursor already closed has nothing to cancel
                pass

    def close(self) -> None:
        self._timer.cancel()
        self._conn.close()
