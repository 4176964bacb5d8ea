"""SQL Server bad input: every kind fails with a message that names what is wrong and what to do,
and writes nothing (the standard of ``tests/integration/test_bad_input.py``, whose runner, setup
cases and helpers this module imports).

Each test fingerprints everything a SQL Server capture can write (:func:`written`: the files under
the sink path, the stored offset, and the CDC state as SQL Server shows it through T-SQL: the
database settings, the capture instances with their columns, every table with its CDC flag and row
count, change tables included, the CDC jobs and SQL Server Agent's state) before and after the
failing run, and asserts both are equal. Runtime inputs run through real Airflow (``dag.test``) on
the SQL Server stand-in (docs/sqlserver-standin.md), sharing one database; each case restores what
it changed. Every task has retries, and no bad input is retried: each fails the task for good.
Pure configuration errors fail when the DAG file is parsed.

The running captures use ``snapshot_mode="never"`` (stream windows write Parquet with Arrow, no
Spark), except the purge case: it needs the default ``snapshot_mode="initial"`` after a real
snapshot, and a database of its own (the cleanup job purges every capture instance of a database).
The database without CDC is a second stand-in database too.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.cdc.planning.offset import OffsetIdentity
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.sources.sqlserver.offset import SqlServerOffset
from tests.integration.test_bad_input import (
    OFFSETS,
    SetupCase,
    _blocker_file,
    _foreign_offset,
    _sink_files,
    _stored_offset,
    assert_says,
    run_refused,
)
from tests.support import airflow as af
from tests.support.sqlserver import SqlServerStandIn, StatementRecorder, workload
from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, airflow_connection

pytestmark = [pytest.mark.airflow]

#: Every statement sent to this module's stand-ins (product and tests), checked as T-SQL last.
RECORDER = StatementRecorder()
HOSTILE_SCHEMA, HOSTILE_TABLE = "Sch ema", "wé]ird.na me; DROP TABLE x--"
HOSTILE = f"[{HOSTILE_SCHEMA}].[{HOSTILE_TABLE.replace(']', ']]')}]"
HOSTILE_MISSPELT = HOSTILE.replace("wé", "we")
EXTRA_SCHEMA = (
    "CREATE TABLE dbo.keyless (v nvarchar(20) NULL, n int NOT NULL)",
    "CREATE UNIQUE INDEX ux_keyless_n ON dbo.keyless (n)",
    "CREATE TABLE dbo.shrunk (id int NOT NULL PRIMARY KEY, legacy nvarchar(10) NULL, v int NULL)",
    "CREATE TABLE dbo.partial (id int NOT NULL PRIMARY KEY, note nvarchar(50) NULL, amount decimal(10,2) NULL)",
    "CREATE TABLE dbo.uncaptured (id int NOT NULL PRIMARY KEY, v nvarchar(10) NULL)",
    "CREATE TABLE dbo.audit (id int NOT NULL PRIMARY KEY, what nvarchar(50) NULL)",
    "CREATE TABLE dbo.x (id int NOT NULL PRIMARY KEY)",  # the target of the hostile name's DROP TABLE
    # A signal table with Debezium's columns under other names (CDC-enabled).
    "CREATE TABLE dbo.bad_signal (id varchar(42) NOT NULL PRIMARY KEY, kind varchar(32) NULL, "
    "payload varchar(2048) NULL)",
    "CREATE VIEW dbo.customer_view AS SELECT id, name FROM dbo.customers",
    f"CREATE SCHEMA [{HOSTILE_SCHEMA}]",
    f"CREATE TABLE {HOSTILE} ([id] int NOT NULL PRIMARY KEY, [v] nvarchar(10) NULL)",
)


# -- "nothing written": a fingerprint of everything a SQL Server capture can write -------------


@dataclass(frozen=True)
class Written:
    sink: tuple  # (path relative to the sink path, sha1 of the content or "dir")
    offset: str | None  # the stored offset document, verbatim
    databases: tuple  # sys.databases: (name, is_cdc_enabled, snapshot_isolation_state, is_read_committed_snapshot_on)
    instances: tuple  # cdc.change_tables: (instance, source table, start_lsn, index_name, role), captured columns
    tables: tuple  # (schema, name, is_tracked_by_cdc, rows) of every table, change tables included
    jobs: tuple  # msdb.dbo.cdc_jobs and the SQL Server services (the Agent runs the capture job)


def written(standin: SqlServerStandIn, capture: SqlServerCapture) -> Written:
    """Everything ``capture`` could have written: compare one taken before a run with one after."""
    if standin.admin_query("SELECT agent_running AND capture_job_running FROM standin.settings")[0][0]:
        standin.wait_until_captured()  # the test's own changes are in the change tables first
    q = standin.execute_tsql
    databases = q(
        "SELECT name, is_cdc_enabled, snapshot_isolation_state, is_read_committed_snapshot_on FROM sys.databases "
        "ORDER BY database_id"
    )
    instances = q(
        "SELECT ct.capture_instance, OBJECT_SCHEMA_NAME(ct.source_object_id), OBJECT_NAME(ct.source_object_id), "
        "ct.start_lsn, ct.index_name, ct.role_name, ct.supports_net_changes FROM cdc.change_tables ct "
        "ORDER BY ct.capture_instance"
    )
    columns = q(
        "SELECT ct.capture_instance, cc.column_name, cc.column_ordinal FROM cdc.captured_columns cc "
        "JOIN cdc.change_tables ct ON ct.object_id = cc.object_id ORDER BY ct.capture_instance, cc.column_ordinal"
    )
    tables = [
        (schema, name, tracked, q(f"SELECT COUNT_BIG(*) FROM [{schema}].[{name.replace(']', ']]')}]")[0][0])
        for schema, name, tracked in q(
            "SELECT s.name, t.name, t.is_tracked_by_cdc FROM sys.tables t JOIN sys.schemas s "
            "ON s.schema_id = t.schema_id ORDER BY s.name, t.name"
        )
    ]
    jobs = q(
        "SELECT job_type, maxtrans, maxscans, continuous, pollinginterval, retention, threshold FROM msdb.dbo.cdc_jobs "
        "ORDER BY job_type"
    ) + q("SELECT servicename, status_desc FROM sys.dm_server_services ORDER BY servicename")
    return Written(
        _sink_files(capture.sink_path),
        _stored_offset(None, capture),  # a Variable (SQL Server captures have no state-table store)
        _rows(databases),
        (_rows(instances), _rows(columns)),
        _rows(tables),
        _rows(jobs),
    )


def _rows(found: Any) -> tuple:
    return tuple(tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in row) for row in found)


# -- DAGs: setup >> snapshot >> window, with retries that a bad input must never use -----------

RETRIED: list[str] = []


def capture_dag(dag_id: str, capture: SqlServerCapture, errors: dict, **window_kwargs: Any):
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
    from airflow_provider_cdc.operators.window import CdcWindowOperator

    def retried(context) -> None:
        RETRIED.append(f"{dag_id}.{context['task_instance'].task_id}: {context.get('exception')!r}")

    with DAG(
        dag_id,
        schedule="@hourly",
        start_date=af.START,
        catchup=False,
        max_active_runs=1,
        default_args={
            "on_failure_callback": af.failure_recorder(errors),
            "on_retry_callback": retried,
            "retries": 2,
            "retry_delay": timedelta(0),
        },
    ) as dag:
        (
            CdcSetupOperator(task_id="setup", capture=capture)
            >> CdcSnapshotOperator(task_id="snapshot", capture=capture)
            >> CdcWindowOperator(task_id="window", capture=capture, **window_kwargs)
        )
    af.register(dag)
    return dag


def refused(standin: SqlServerStandIn, dag_id: str, capture: SqlServerCapture, task: str, **kwargs: Any) -> str:
    """``run_refused`` of the PostgreSQL module with this module's DAG and fingerprint; the failed
    task was not retried. Returns the error as ``"<class>: <message>"``."""
    before = written(standin, capture)
    RETRIED.clear()
    message = run_refused(
        dag_id, capture, task, db=standin, before=before, make_dag=capture_dag, written_by=written, **kwargs
    )
    assert RETRIED == [], RETRIED
    return message


def succeeded(dag_id: str, capture: SqlServerCapture, hour: int) -> dict:
    errors: dict = {}
    result = af.run(capture_dag(dag_id, capture, errors), hour, errors=errors)
    assert result.state == "success", (result.tasks, errors)
    return result.xcom


# -- the source: one stand-in database for every runtime case ---------------------------------


@dataclass
class Source:
    standin: SqlServerStandIn
    sinks: Path
    conn_ids: dict[str, str]
    passwords: dict[str, str] = field(default_factory=dict)

    def capture(self, name: str, *, conn: str = "superuser", **overrides: Any) -> SqlServerCapture:
        """A capture of the shop tables whose names (prefix, sink, offset key) are ``name``'s own."""
        args: dict[str, Any] = {
            "sqlserver_conn_id": self.conn_ids[conn],
            "tables": list(workload.TABLES),
            "topic_prefix": name,
            "sink_path": str(self.sinks / name),
            "offset_store": OFFSETS,
            "spark_master": "local[2]",
        }
        return SqlServerCapture(**{**args, **overrides})


def start_standin(clusters, database: str) -> SqlServerStandIn:
    return SqlServerStandIn(clusters["pg15"], database, recorder=RECORDER, poll_interval=0.05).start()


def connection(standin: SqlServerStandIn, **changes: Any) -> str:
    """The stand-in's Airflow connection (JSON) with ``changes`` to its fields."""
    return json.dumps({**json.loads(airflow_connection(standin)), **changes})


@pytest.fixture(scope="module")
def src(clusters, airflow_db, tmp_path_factory) -> Iterator[Source]:
    standin = start_standin(clusters, "ss_bad_input")
    try:
        for statement in workload.SCHEMA + EXTRA_SCHEMA:
            standin.execute_tsql(statement)
        standin.enable_db()
        standin.set_snapshot_isolation(True)
        for table in (*workload.TABLES, "dbo.keyless", "dbo.audit", "dbo.shrunk", "dbo.bad_signal"):
            standin.enable_table(*table.split("."))
        # A column dropped after CDC was enabled: its capture instance still has it. (The stand-in does not
        # translate ALTER TABLE ... DROP COLUMN: dropped on the PostgreSQL side, as the DBA's T-SQL would.)
        standin.admin_query('ALTER TABLE dbo.shrunk DROP COLUMN "legacy"')
        standin.enable_table("dbo", "partial", captured_column_list="note, amount")  # not the key
        workload.seed(standin, customers=4, orders_per_customer=1)
        user, password, wrong = "ss_bi_noselect", secrets.token_urlsafe(12), "Wr0ng-" + secrets.token_urlsafe(12)
        standin.create_login(user, password)  # reads the catalog, not the tables or the change tables
        standin.wait_until_captured()
        connections = {
            "superuser": connection(standin),
            "noselect": connection(standin, login=user, password=password),
            "wrong_password": connection(standin, password=wrong),
            "no_database": connection(standin, schema=None),
            "unknown_database": connection(standin, schema="ss_no_such_database"),
        }
        conn_ids = {name: f"ss_bi_{name}" for name in connections}
        with pytest.MonkeyPatch.context() as env:
            for name, value in connections.items():
                env.setenv(f"AIRFLOW_CONN_{conn_ids[name].upper()}", value)
            env.setenv(*DRIVER_IN_EXTRA_ALLOWED)
            conn_ids["unknown"] = "ss_bi_no_such_connection"
            yield Source(
                standin,
                tmp_path_factory.mktemp("ss-bad-input-sinks"),
                conn_ids,
                {"noselect": password, "wrong_password": wrong, "superuser": standin.cluster.password},
            )
    finally:
        standin.stop()


# -- parse time: SqlServerCapture validates its fields when the DAG file is imported ---------

DAG_FILE = """
from airflow.sdk import DAG

from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator

capture = SqlServerCapture(**{kwargs!r})
with DAG({dag_id!r}, schedule=None):
    CdcSetupOperator(task_id="setup", capture=capture) >> CdcWindowOperator(task_id="window", capture=capture)
"""


@pytest.mark.parametrize(
    ("overrides", "phrases"),
    [
        pytest.param(
            {"data_query_mode": "table"},
            ["data_query_mode 'table' is not one of function, direct"],
            id="unknown-data-query-mode",
        ),
        pytest.param(
            {"snapshot_isolation_mode": "exclusive"},
            ["snapshot_isolation_mode 'exclusive' is not one of snapshot, read_committed"],
            id="unknown-snapshot-isolation-mode",
        ),
        pytest.param(
            {"server_time_zone": "Mars/Olympus_Mons"},
            ["server_time_zone 'Mars/Olympus_Mons' is not an IANA time zone name (e.g. 'UTC', 'Europe/Berlin'"],
            id="unknown-server-time-zone",
        ),
        pytest.param(
            {"offset_store": "state_table"},
            ["offset_store='state_table' keeps offsets in a PostgreSQL table", "uses 'variable'"],
            id="state-table-offset-store",
        ),
        pytest.param(
            {"signal_table": "shop.dbo.cdc_signal"},
            ["signal_table 'shop.dbo.cdc_signal' is invalid: table name 'shop.dbo.cdc_signal' has 3 parts"],
            id="signal-table-three-parts",
        ),
        pytest.param(
            {"sqlserver_conn_id": ""},
            ["sqlserver_conn_id is required, got ''", "the id of the Airflow connection (type mssql)"],
            id="empty-conn-id",
        ),
        pytest.param(
            {"odbc_driver": "{ODBC Driver 18 for SQL Server}"},
            ["odbc_driver '{ODBC Driver 18 for SQL Server}' is not an ODBC driver name", "without braces"],
            id="braced-odbc-driver",
        ),
        pytest.param(
            {"tables": ["[dbo.orders", "dbo.customers"]},
            ["unterminated quoted identifier in '[dbo.orders'"],
            id="unterminated-bracket",
        ),
        pytest.param(
            {"tables": ["shop.dbo.orders"]},
            ["table name 'shop.dbo.orders' has 3 parts", "expected 'schema.table'", "[my.schema].[my.table]"],
            id="three-part-table-name",
        ),
        pytest.param(
            {"tables": ["dbo.orders", "[dbo].[orders]"]},
            ["tables listed more than once: "],
            id="duplicate-tables",
        ),
        pytest.param(
            {"snapshot_mode": "exported"},
            ["snapshot_mode 'exported' is not supported", "choose one of initial, always, never"],
            id="unsupported-snapshot-mode",
        ),
        pytest.param({"binary_handling_mode": "base32"}, ["binary handling mode 'base32'"], id="handling-mode-binary"),
        pytest.param(
            {"new_table_snapshot": "incremental"},
            ["new_table_snapshot='incremental' needs signal_table on SQL Server", "or new_table_snapshot='fail'"],
            id="incremental-new-tables-without-signal-table",
        ),
        pytest.param(
            {"signal_table": "dbo.cdc_signal", "incremental_watermarks": "message"},
            ["incremental_watermarks 'message' is not available on SQL Server", "insert_insert, insert_delete"],
            id="message-watermarks",
        ),
        pytest.param(
            {"signal_table": "dbo.cdc_signal", "incremental_watermark_wait_seconds": 0},
            ["incremental_watermark_wait_seconds must be a number of seconds from 1 to 3600, got 0"],
            id="watermark-wait-zero",
        ),
        pytest.param(
            {"column_masks": {"column.mask.with.4.chars": "dbo.customers.(name"}},
            ["column pattern 'dbo.customers.(name' is not a valid regular expression"],
            id="column-mask-invalid-pattern",
        ),
    ],
)
def test_bad_configuration_fails_the_dag_import(src, tmp_path, request, overrides, phrases):
    from airflow.dag_processing.dagbag import DagBag

    name = "ss_parse_" + request.node.callspec.id.replace("-", "_")
    base = src.capture(name)
    before = written(src.standin, base)
    kwargs = {
        "sqlserver_conn_id": base.sqlserver_conn_id,
        "tables": list(workload.TABLES),
        "topic_prefix": name,
        "sink_path": base.sink_path,
        **overrides,
    }
    path = tmp_path / f"{name}.py"
    path.write_text(DAG_FILE.format(kwargs=kwargs, dag_id=name))
    bag = DagBag(dag_folder=str(path))
    assert name not in bag.dags
    (error,) = bag.import_errors.values()
    assert "CdcConfigurationError" in error
    assert_says(error, *phrases)
    assert written(src.standin, base) == before


# -- setup: the database, tables, capture instances, grants, Agent, sink and offset are checked


def _paused(source: Source, capture: SqlServerCapture) -> Callable[[], None]:
    source.standin.pause_capture()  # "SQL Server Agent stopped": sys.dm_server_services says so
    return source.standin.resume_capture


def _view_server_state(source: Source, login: str) -> Callable[[], None]:
    # sys.dm_server_services needs VIEW SERVER STATE (docs/sqlserver.md's optional grant): without it
    # the login cannot see the Agent at all, as on SQL Server (docs/sqlserver-standin.md, Sources).
    source.standin.execute_tsql(f"GRANT VIEW SERVER STATE TO [{login}];")
    return lambda: source.standin.execute_tsql(f"REVOKE VIEW SERVER STATE FROM [{login}];")


def _snapshot_isolation_off(source: Source, capture: SqlServerCapture) -> Callable[[], None]:
    source.standin.set_snapshot_isolation(False)
    return lambda: source.standin.set_snapshot_isolation(True)


def _offset_of_another_database(source: Source, capture: SqlServerCapture) -> Callable[[], None]:
    """A SQL Server offset copied from a capture of another database (another GUID and name)."""
    from airflow.models import Variable

    identity = OffsetIdentity(capture.topic_prefix, "6F9619FF-8B86-D011-B42D-00C04FC964FF", "production")
    document = SqlServerOffset(identity, lsn=SqlServerLsn("0000002a:00000bd8:0003"), snapshot_completed=True)
    key = OFFSETS.key(capture.topic_prefix)
    Variable.set(key, document.to_json())
    return lambda: Variable.delete(key)


def _guid(source: Source) -> str:
    return str(source.standin.execute_tsql("SELECT database_guid FROM sys.database_recovery_status")[0][0]).upper()


SETUP_CASES = {
    "capture-instance-missing": SetupCase(
        (
            "table [dbo].[uncaptured] has no capture instance: CDC is not enabled on it",
            "Run: EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'uncaptured', "
            "@role_name = NULL;",
        ),
        {"tables": ["dbo.customers", "dbo.uncaptured"]},
    ),
    "unknown-table": SetupCase(
        (
            "these tables do not exist (or are not visible to the capture login): [dbo].[refunds]. Check the spelling",
            "quote names that contain dots or spaces with brackets: [my.schema].[my table]",
        ),
        {"tables": [*workload.TABLES, "dbo.refunds"]},
    ),
    "misspelt-table": SetupCase(
        ("[dbo].[custmers] (did you mean [dbo].[customers]?)",),
        {"tables": ["dbo.custmers", "dbo.orders"]},
    ),
    "misspelt-hostile-identifier": SetupCase(
        (f"{HOSTILE_MISSPELT} (did you mean {HOSTILE}?)",),
        {"tables": [HOSTILE_MISSPELT]},
    ),
    "view": SetupCase(
        ("[dbo].[customer_view] (a view: change data capture records tables only; capture the tables it reads",),
        {"tables": ["dbo.customers", "dbo.customer_view"]},
    ),
    "no-key-and-no-index-name": SetupCase(
        (
            "table [dbo].[keyless] has no primary key and its capture instance 'dbo_keyless' names no unique index "
            "(@index_name): change events need a key",
            "Add a primary key (ALTER TABLE [dbo].[keyless] ADD PRIMARY KEY (<key columns>)), or re-create the "
            "capture instance on a unique index (the table has [ux_keyless_n]): EXEC sys.sp_cdc_disable_table "
            "@source_schema = N'dbo', @source_name = N'keyless', @capture_instance = N'dbo_keyless'; "
            "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'keyless', "
            "@capture_instance = N'dbo_keyless', @index_name = N'ux_keyless_n', @role_name = NULL;",
        ),
        {"tables": ["dbo.customers", "dbo.keyless"]},
    ),
    "captured-column-dropped": SetupCase(
        (
            "capture instance 'dbo_shrunk' of [dbo].[shrunk] captures column(s) [legacy] the table no longer has",
            "Create a capture instance for the table's current columns (at most two per table; the capture switches "
            "to it): EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'shrunk', "
            "@capture_instance = N'<new instance name>', @role_name = NULL;",
            "drop the old one: EXEC sys.sp_cdc_disable_table @source_schema = N'dbo', @source_name = N'shrunk', "
            "@capture_instance = N'dbo_shrunk';",
        ),
        {"tables": ["dbo.shrunk"]},
    ),
    "key-column-not-captured": SetupCase(
        (
            "capture instance 'dbo_partial' of [dbo].[partial] does not capture key column(s) [id]: change events "
            "need the key",
            "@captured_column_list = N'[note], [amount], [id]'",
        ),
        {"tables": ["dbo.partial"]},
    ),
    "no-select-permission": SetupCase(
        (
            "missing permissions:",
            "the capture login (database user [ss_bi_noselect]) cannot SELECT from [dbo].[customers], "
            "[dbo].[orders], which the snapshot reads (SQL Server error 229 or 230). Run: "
            "GRANT SELECT ON [dbo].[customers] TO [ss_bi_noselect]; "
            "GRANT SELECT ON [dbo].[orders] TO [ss_bi_noselect];",
            "cannot read the changes of capture instance(s) 'dbo_customers', 'dbo_orders': The SELECT permission "
            "was denied on the object 'dbo_customers_CT'",
            "(229). Run: GRANT SELECT ON SCHEMA::[cdc] TO [ss_bi_noselect];",
        ),
        conn="noselect",
    ),
    "signal-table-not-cdc-enabled": SetupCase(
        (
            "the signal table cannot be used:",
            "table [dbo].[uncaptured] has no capture instance: CDC is not enabled on it",
        ),
        {"signal_table": "dbo.uncaptured"},
    ),
    "signal-table-columns": SetupCase(
        (
            "the signal table cannot be used:",
            "signal table [dbo].[bad_signal] must start with the columns id, type, data (it has id, kind, payload)",
        ),
        {"signal_table": "dbo.bad_signal"},
    ),
    "agent-stopped": SetupCase(
        (
            "the capture job is not running:",
            "SQL Server Agent is not running: the capture job that fills the change tables runs under it",
            "Start the SQL Server Agent service (and the capture job: EXEC sys.sp_cdc_start_job @job_type = "
            "N'capture';)",
        ),
        prepare=_paused,
    ),
    "snapshot-isolation-off": SetupCase(
        (
            "snapshot_isolation_mode='snapshot' needs snapshot isolation on database [ss_bad_input]",
            "Run: ALTER DATABASE [ss_bad_input] SET ALLOW_SNAPSHOT_ISOLATION ON;",
            "or choose snapshot_isolation_mode='read_committed'",
        ),
        prepare=_snapshot_isolation_off,
    ),
    "wrong-password": SetupCase(
        (
            "Airflow connection 'ss_bi_wrong_password' was refused by the server",
            "Login failed for user 'postgres'. (18456)",
            "Fix the connection's login, password or database",
        ),
        conn="wrong_password",
        secret="wrong_password",
    ),
    "connection-without-database": SetupCase(
        (
            "Airflow connection 'ss_bi_no_database' cannot be used: the SQL Server connection names no database "
            "(set the connection's schema)",
        ),
        conn="no_database",
    ),
    "unknown-database": SetupCase(
        (
            "Airflow connection 'ss_bi_unknown_database' was refused by the server",
            'Cannot open database "ss_no_such_database" requested by the login. The login failed. (4060)',
            "Fix the connection's login, password or database",
        ),
        conn="unknown_database",
    ),
    "unknown-airflow-connection": SetupCase(
        (
            "CdcConfigurationError: The conn_id `ss_bi_no_such_connection` isn't defined: create the Airflow "
            "connection 'ss_bi_no_such_connection' (type mssql",
            "or fix sqlserver_conn_id",
        ),
        conn="unknown",
    ),
    "include-list-matches-nothing": SetupCase(
        ("no table to capture: table_include_list ['sales\\\\..*']", "must match a whole 'schema.table' name"),
        {"tables": [], "table_include_list": ["sales\\..*"]},
    ),
    "mask-on-a-key-column": SetupCase(
        ("[dbo].[customers].id is a key column: key columns are never masked",),
        {"column_masks": {"column.mask.hash.SHA-256.with.salt.pepper": "dbo.customers.id"}},
    ),
    "mask-on-a-numeric-column": SetupCase(
        ("masking rule 'dbo.orders.amount' matches [dbo].[orders].amount", "masks apply to character columns only"),
        {"column_masks": {"column.mask.with.4.chars": "dbo.orders.amount"}},
    ),
    "sink-path-is-a-file": SetupCase(
        ("exists and is not a directory: point sink_path at a directory",),
        {"sink_path": "{sinks}/blocker.txt"},
        prepare=_blocker_file,
    ),
    "offset-of-the-postgresql-connector": SetupCase(
        (
            "InvalidOffsetError: Airflow Variable 'bi_offset__offset_of_the_postgresql_connector': the stored offset "
            "belongs to connector 'postgresql', not 'sqlserver'",
            "Delete it: the next run restores it from the sink's commit log",
        ),
        prepare=_foreign_offset(),
    ),
    "offset-copied-from-another-database": SetupCase(
        (
            "InvalidOffsetError: Airflow Variable 'bi_offset__offset_copied_from_another_database': the stored offset "
            "belongs to another capture (database_guid is '6F9619FF-8B86-D011-B42D-00C04FC964FF', expected '{guid}'",
            "database is 'production', expected 'ss_bad_input'",
            "Delete the stored offset: the next run restores this capture's own from its sink's commit log",
        ),
        prepare=_offset_of_another_database,
    ),
}


@pytest.mark.parametrize("kind", list(SETUP_CASES))
def test_setup_refuses_bad_input_before_anything_is_written(src, kind, capfd, caplog):
    case = SETUP_CASES[kind]
    name = kind.replace("-", "_")
    overrides = {k: v.format(sinks=src.sinks) if isinstance(v, str) else v for k, v in case.overrides.items()}
    capture = src.capture(name, conn=case.conn, **overrides)
    cleanup = case.prepare(src, capture) if case.prepare else None
    try:
        message = refused(src.standin, f"ss_bad_{name}", capture, "setup")
    finally:
        if cleanup:
            cleanup()
    assert message.startswith(f"{case.error}: "), message
    assert_says(message, *(p.replace("{guid}", _guid(src)) for p in case.phrases))
    if case.secret:  # neither in the error nor in the task log
        shown = message + capfd.readouterr().out + caplog.text
        assert src.passwords[case.secret] not in shown and src.passwords["superuser"] not in shown
    assert src.standin.execute_tsql("SELECT COUNT_BIG(*) FROM dbo.x")[0][0] == 0  # the DROP TABLE never ran


def test_setup_reports_every_problem_in_one_error_before_anything_is_written(src):
    """A typo'd table, a table without key, a key the capture instance leaves out, a table without
    capture instance, missing grants, the Agent stopped, snapshot isolation off, a sink path inside
    a file and a copied offset: one error lists each with its fix, as one traceback."""
    import traceback

    capture = src.capture(
        "many_problems",
        conn="noselect",
        tables=["dbo.custmers", "dbo.orders", "dbo.keyless", "dbo.partial", "dbo.uncaptured"],
        sink_path=str(src.sinks / "blocker.txt" / "lake"),
    )
    _blocker_file(src, capture)
    undo = [
        _offset_of_another_database(src, capture),
        _snapshot_isolation_off(src, capture),
        _view_server_state(src, "ss_bi_noselect"),
        _paused(src, capture),
    ]
    try:
        before = written(src.standin, capture)
        RETRIED.clear()
        errors: dict = {}
        result = af.run(capture_dag("ss_bad_many_problems", capture, errors), 0, errors=errors)
        assert result.tasks == {"setup": "failed", "snapshot": "upstream_failed", "window": "upstream_failed"}
        assert written(src.standin, capture) == before and RETRIED == []
    finally:
        for step in reversed(undo):
            step()
    message = result.error("setup")
    user = "[ss_bi_noselect]"
    problems = {
        "sink path": ("blocker.txt/lake' cannot be created", "Choose another sink_path"),
        "snapshot isolation": ("ALTER DATABASE [ss_bad_input] SET ALLOW_SNAPSHOT_ISOLATION ON;",),
        "typo": ("[dbo].[custmers] (did you mean [dbo].[customers]?)",),
        "keyless": ("table [dbo].[keyless] has no primary key", "@index_name = N'ux_keyless_n'"),
        "key not captured": (
            "does not capture key column(s) [id]",
            "@captured_column_list = N'[note], [amount], [id]'",
        ),
        "no capture instance": ("EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'uncaptured'",),
        "table grants": (
            "cannot SELECT from [dbo].[keyless], [dbo].[orders], [dbo].[partial], [dbo].[uncaptured]",
            f"GRANT SELECT ON [dbo].[uncaptured] TO {user};",
        ),
        "change table grants": (
            "changes of capture instance(s) 'dbo_orders'",
            f"GRANT SELECT ON SCHEMA::[cdc] TO {user};",
        ),
        "agent": ("SQL Server Agent is not running", "EXEC sys.sp_cdc_start_job @job_type = N'capture';"),
        "offset": (
            "Airflow Variable 'bi_offset__many_problems': the stored offset belongs to another capture",
            "Delete the stored offset",
        ),
    }
    assert message.startswith(
        f"AirflowFailException: CdcConfigurationError: setup found {len(problems)} problems and created or changed "
        "nothing; fix each of them, then run it again:\n"
    ), message
    for phrases in problems.values():
        assert_says(message, *phrases)
    numbered = [line for line in message.splitlines() if line.lstrip().split(".")[0].isdigit()]
    assert len(numbered) == len(problems), message
    shown = "".join(traceback.format_exception(result.errors["setup"]))  # as the task log prints it
    assert shown.count("Traceback (most recent call last)") == 1, shown
    assert "direct cause" not in shown and "During handling" not in shown, shown


_FIX = re.compile(r"((?:USE|EXEC|ALTER DATABASE) [^;]*;)")


def _apply_fixes(standin: SqlServerStandIn, message: str) -> list[str]:
    """Run the T-SQL statements a message tells the DBA to run, in order."""
    statements = [s.rstrip(";") for s in _FIX.findall(message) if not s.startswith("USE ")]
    for statement in statements:
        standin.execute_tsql(statement)
    return statements


@pytest.fixture
def plain(clusters, airflow_db, src) -> Iterator[SqlServerStandIn]:
    """A database with the shop tables, where nobody enabled change data capture."""
    standin = start_standin(clusters, "ss_bad_input_plain")
    try:
        for statement in workload.SCHEMA:
            standin.execute_tsql(statement)
        workload.seed(standin, customers=2, orders_per_customer=1)
        yield standin
    finally:
        standin.stop()


def test_database_without_cdc_is_refused_and_the_fixes_named_make_setup_pass(src, plain, monkeypatch):
    import logging

    monkeypatch.setenv("AIRFLOW_CONN_SS_BI_PLAIN", connection(plain))
    capture = src.capture("plain", sqlserver_conn_id="ss_bi_plain")
    message = refused(plain, "ss_bad_plain", capture, "setup")
    assert_says(
        message,
        "AirflowFailException: CdcConfigurationError: setup found 4 problems",
        "change data capture is not enabled on database [ss_bad_input_plain]. Run, as a member of sysadmin: "
        "USE [ss_bad_input_plain]; EXEC sys.sp_cdc_enable_db;",
        "ALTER DATABASE [ss_bad_input_plain] SET ALLOW_SNAPSHOT_ISOLATION ON;",
        "table [dbo].[customers] has no capture instance",
        "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'orders', @role_name = NULL;",
    )
    applied = _apply_fixes(plain, message)
    assert len(applied) == 4, applied
    summary = capture.setup(logging.getLogger(__name__))  # what the message said to run was all it takes
    assert summary["capture_instances"] == {"dbo.customers": ["dbo_customers"], "dbo.orders": ["dbo_orders"]}


def test_the_fixes_named_for_capture_instances_make_setup_pass(src):
    import logging

    capture = src.capture("fixed_instances", tables=["dbo.keyless", "dbo.partial", "dbo.uncaptured"])
    message = refused(src.standin, "ss_bad_fixed_instances", capture, "setup")
    try:
        assert len(_apply_fixes(src.standin, message)) == 5
        summary = capture.setup(logging.getLogger(__name__))
        assert summary["key_columns"] == {"dbo.keyless": ["n"], "dbo.partial": ["id"], "dbo.uncaptured": ["id"]}
    finally:  # back to the bad state the other cases use
        standin = src.standin
        standin.disable_table("dbo", "uncaptured")
        for table, columns in (("keyless", None), ("partial", "note, amount")):
            standin.disable_table("dbo", table)
            standin.enable_table("dbo", table, captured_column_list=columns)


# -- run start: a running capture's stored offset and requested window end ---------------------


@dataclass
class Running:
    capture: SqlServerCapture
    offset: dict  # the good stored offset, restored after each case


@pytest.fixture(scope="module")
def running(src) -> Running:
    """A capture that committed two stream windows (one with a change)."""
    capture = src.capture("ss_running", snapshot_mode="never")
    nothing = written(src.standin, capture)
    succeeded("ss_bad_running", capture, 0)
    src.standin.execute_tsql("INSERT INTO dbo.customers (id, name, balance, active) VALUES (900, N'late', 1, 1)")
    src.standin.wait_until_captured()
    assert succeeded("ss_bad_running", capture, 1)["window"]["changes"] == 1
    after = written(src.standin, capture)
    assert after.sink != nothing.sink and after.offset != nothing.offset  # the fingerprint sees what runs write
    return Running(capture, json.loads(after.offset))


def _store_offset(capture: SqlServerCapture, text: str) -> None:
    from airflow.models import Variable

    Variable.set(OFFSETS.key(capture.topic_prefix), text)


@pytest.mark.parametrize(
    ("corrupt", "phrases"),
    [
        pytest.param(
            lambda doc: '{"format": 1, "next_lsn": ',
            ["the stored offset is not valid JSON", "Delete it: the next run restores it from the sink's commit log"],
            id="malformed-json",
        ),
        pytest.param(
            lambda doc: json.dumps([doc]),
            ["the stored offset is not a JSON object", "Delete it: the next run restores it"],
            id="json-not-an-object",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "next_lsn": "next Tuesday"}),
            ["malformed offset document", "not a SQL Server LSN: 'next Tuesday'", "Delete it: the next run restores"],
            id="garbage-lsn-in-document",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "next_lsn": "0/16B3748"}),
            ["not a SQL Server LSN: '0/16B3748'", "'vlf:block:slot' form", "Delete it: the next run restores"],
            id="postgresql-lsn-in-document",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "connector": "postgresql"}),
            ["the stored offset belongs to connector 'postgresql', not 'sqlserver'", "Delete it"],
            id="postgresql-connector",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "format": 7}),
            ["has format 7, newer than this provider understands (1); upgrade airflow-provider-cdc"],
            id="future-format",
        ),
        pytest.param(
            lambda doc: json.dumps(
                {**doc, "database_guid": "6F9619FF-8B86-D011-B42D-00C04FC964FF", "database": "shop"}
            ),
            [
                "belongs to another capture (database_guid is '6F9619FF-8B86-D011-B42D-00C04FC964FF', expected",
                "database is 'shop', expected 'ss_bad_input'",
                "only valid for the server and database that produced them",
                "Delete the stored offset",
            ],
            id="copied-from-another-database",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "topic_prefix": "shop"}),
            ["topic_prefix is 'shop', expected 'ss_running'", "Delete the stored offset"],
            id="another-topic-prefix",
        ),
    ],
)
def test_bad_stored_offset_is_refused_and_left_alone(src, running, request, corrupt, phrases):
    capture = running.capture
    _store_offset(capture, corrupt(running.offset))
    try:
        message = refused(src.standin, f"ss_bad_offset_{request.node.callspec.id}", capture, "setup")
        assert_says(
            message, "AirflowFailException: InvalidOffsetError: Airflow Variable 'bi_offset__ss_running'", *phrases
        )
    finally:
        _store_offset(capture, json.dumps(running.offset))


@pytest.mark.parametrize(
    ("upto", "phrases"),
    [
        pytest.param(
            lambda offset, newest: "abc",
            ["upto_lsn of task 'window' is invalid: not a SQL Server LSN: 'abc'", "'vlf:block:slot' form"],
            id="not-an-lsn",
        ),
        pytest.param(
            lambda offset, newest: "0/16B3748",
            ["upto_lsn of task 'window' is invalid: not a SQL Server LSN: '0/16B3748'", "'0000002a:00000bd8:0003'"],
            id="postgresql-lsn",
        ),
        pytest.param(
            lambda offset, newest: str(SqlServerLsn(newest + (1 << 40))),
            ["is ahead of the server's capture job's position", "leave upto_lsn empty for the current position"],
            id="beyond-the-capture-job",
        ),
        pytest.param(
            lambda offset, newest: str(SqlServerLsn(offset - 1)),
            ["is behind the committed offset", "a window cannot end before it starts"],
            id="behind-the-offset",
        ),
    ],
)
def test_bad_upto_lsn_is_refused(src, running, request, upto, phrases):
    capture = running.capture
    newest = int(SqlServerLsn(src.standin.wait_until_captured()))
    value = upto(running.offset["next_lsn"], newest)
    dag_id = f"ss_bad_upto_{request.node.callspec.id}"
    # hour 2: after the fixture's runs (an earlier interval would be a replay, which reads nothing)
    message = refused(src.standin, dag_id, capture, "window", hour=2, upto_lsn=value)
    assert_says(message, "AirflowFailException: InvalidLsnError: ", value, *phrases)


# -- changes the capture needs are gone: a disabled capture instance, the cleanup job ----------


def test_capture_instance_disabled_after_the_capture_started_is_refused(src):
    capture = src.capture("ss_disabled", tables=["dbo.audit"], snapshot_mode="never")
    standin = src.standin
    succeeded("ss_bad_disabled", capture, 0)
    standin.execute_tsql("INSERT INTO dbo.audit (id, what) VALUES (1, N'seen')")
    standin.wait_until_captured()
    assert succeeded("ss_bad_disabled", capture, 1)["window"]["changes"] == 1
    standin.disable_table("dbo", "audit")
    try:
        standin.execute_tsql("INSERT INTO dbo.audit (id, what) VALUES (2, N'never captured')")
        message = refused(standin, "ss_bad_disabled", capture, "setup", hour=2)
        assert_says(
            message,
            "AirflowFailException: CdcConfigurationError: setup found 2 problems",
            "table [dbo].[audit] has no capture instance: CDC is not enabled on it. Run: EXEC sys.sp_cdc_enable_table "
            "@source_schema = N'dbo', @source_name = N'audit', @role_name = NULL;",
            "Airflow Variable 'bi_offset__ss_disabled': capture instance(s) 'dbo_audit' that this capture reads were "
            "disabled (sys.sp_cdc_disable_table) after it started: the changes made since were not recorded",
            "Enable CDC on the table again, then re-snapshot: run with snapshot_mode='when_needed'",
        )
    finally:
        standin.enable_table("dbo", "audit")
    # Enabled again (a new instance of the same name, starting now): the window refuses the hole.
    message = refused(standin, "ss_bad_disabled", capture, "window", hour=3)
    assert_says(
        message,
        "AirflowFailException: ChangesPurgedError: capture 'ss_disabled' cannot continue from",
        "Re-snapshot (snapshot_mode='when_needed' records the gap and re-snapshots)",
    )


@pytest.mark.spark
def test_changes_purged_by_the_cleanup_job_are_refused(src, clusters, spark, tmp_path, monkeypatch):
    """Snapshot and a window with the default snapshot_mode='initial'; then the cleanup job (retention
    0) purges changes the next window needs: it fails saying so, and writes nothing."""
    standin = start_standin(clusters, "ss_bad_input_purged")
    try:
        workload.create(standin, customers=3, orders_per_customer=1)
        monkeypatch.setenv("AIRFLOW_CONN_SS_BI_PURGED", connection(standin))
        capture = src.capture("ss_purged", sqlserver_conn_id="ss_bi_purged")
        assert capture.snapshot_mode == "initial"
        first = succeeded("ss_bad_purged", capture, 0)
        assert first["snapshot"]["events"] == {"ss_purged.dbo.customers": {"r": 3}, "ss_purged.dbo.orders": {"r": 3}}
        workload.mutate(standin, 1)
        standin.wait_until_captured()
        assert standin.cleanup(retention_minutes=0) is not None
        message = refused(standin, "ss_bad_purged", capture, "window", hour=1)
    finally:
        standin.stop()
    assert_says(
        message,
        "AirflowFailException: ChangesPurgedError: capture 'ss_purged' cannot continue from",
        "(dbo_customers), past the stored offset",
        "the cleanup job purged the changes in between",
        "Re-snapshot (snapshot_mode='when_needed' records the gap and re-snapshots)",
        "raise the cleanup job's retention (sys.sp_cdc_change_job @job_type = N'cleanup', @retention = <minutes>)",
    )


def test_every_statement_sent_is_tsql():
    """Last: what the product and these tests sent to the stand-ins parses as T-SQL."""
    if not RECORDER.statements():
        pytest.skip("no statement was sent: this checks the statements of the module's other tests")
    assert RECORDER.invalid() == []
