"""Provider metadata, registered under the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_provider_cdc import __version__

#: The documentation (also pyproject.toml's Documentation URL, which Airflow shows with the provider).
DOCUMENTATION_URL = "https://github.com/airflow-provider-cdc/airflow-provider-cdc/blob/main/docs/index.md"

# The CDC connection types' own form fields, stored in the connection's extra under these names
# (the hooks read them from plain postgres/mssql/odbc connections' extra too). Declared here,
# not as hook widgets, so the UI gets them without importing the hooks (Airflow 3.2+).
_TEXT = {"type": ["string", "null"]}
_LIBPQ_FIELDS = {
    "sslmode": {
        "label": "SSL mode",
        "schema": {**_TEXT, "enum": [None, "disable", "allow", "prefer", "require", "verify-ca", "verify-full"]},
        "description": (
            "libpq sslmode. Empty: verified TLS (verify-full); a server that offers no TLS is refused, unless it "
            "is on the worker's own host (Unix socket, loopback: unencrypted with a warning in the task log). "
            "verify-full: TLS required. Weaker modes (disable, prefer for a trusted network) are honoured and "
            "logged with what they leave unchecked"
        ),
    },
    "sslrootcert": {
        "label": "SSL root certificate (path on the workers)",
        "schema": _TEXT,
        "description": (
            "CA certificate (PEM) that signed the server's certificate; empty: ~/.postgresql/root.crt, "
            "else the system's trusted roots"
        ),
    },
    "sslcert": {"label": "SSL client certificate (path on the workers)", "schema": _TEXT},
    "sslkey": {
        "label": "SSL client key (path on the workers)",
        "schema": _TEXT,
        "description": "a PEM key file; libpq's engine:key form is refused (no ':')",
    },
    "connect_timeout": {"label": "Connect timeout (seconds)", "schema": {"type": ["integer", "null"]}},
    "application_name": {
        "label": "Application name",
        "schema": _TEXT,
        "description": "shown in pg_stat_activity; the capture adds its own name when empty",
    },
    "target_session_attrs": {
        "label": "Target session attributes",
        "schema": {**_TEXT, "enum": [None, "any", "read-write", "primary"]},
        "description": "read-write: never connect to a standby (slots live on the primary)",
    },
}
_LIBPQ_BEHAVIOUR = {
    "hidden-fields": [],
    "relabeling": {"schema": "Database"},
    "placeholders": {"port": "5432", "login": "a role with REPLICATION", "extra": '{"sslmode": "verify-full"}'},
}
_YUGABYTE_FIELDS = {
    **_LIBPQ_FIELDS,
    "master_addresses": {
        "label": "Master addresses (CDC service)",
        "schema": _TEXT,
        "description": "host:port,... of the masters' RPC port, for YugabyteCdcServiceCapture (default: host:7100)",
    },
    "rpc_sslmode": {
        "label": "RPC TLS mode (CDC service)",
        "schema": {**_TEXT, "enum": [None, "verify-full", "verify-ca", "disable"]},
        "description": "TLS to the masters and tablet servers; empty is verify-full, disable is plaintext",
    },
    "rpc_ssl_root_cert": {"label": "RPC TLS root certificate (path on the workers)", "schema": _TEXT},
    "rpc_ssl_cert": {"label": "RPC TLS client certificate (path on the workers)", "schema": _TEXT},
    "rpc_ssl_key": {"label": "RPC TLS client key (path on the workers)", "schema": _TEXT},
    "rpc_get_changes_max_bytes": {
        "label": "Largest GetChanges response (bytes)",
        "schema": {"type": ["integer", "null"]},
        "description": "default 64 MiB; raise it for clusters with larger GetChanges thresholds or very wide rows",
    },
}
_YUGABYTE_BEHAVIOUR = {**_LIBPQ_BEHAVIOUR, "placeholders": {**_LIBPQ_BEHAVIOUR["placeholders"], "port": "5433"}}
_ODBC_FIELDS = {
    "driver": {
        "label": "ODBC driver (only where the deployment allows it)",
        "schema": _TEXT,
        "description": "an installed driver's name (odbcinst.ini), never a path; used only when the Airflow config "
        "[cdc] sqlserver_allow_driver_in_extra is True, else refused: the DAG's odbc_driver names the driver "
        "(default ODBC Driver 18 for SQL Server). Other extras: Encrypt, TrustServerCertificate, "
        "HostNameInCertificate, ApplicationIntent, ... (docs/sqlserver.md)",
    },
    "Encrypt": {"label": "Encrypt", "schema": {**_TEXT, "enum": [None, "yes", "no", "strict"]}},
    "TrustServerCertificate": {
        "label": "Trust server certificate",
        "schema": {**_TEXT, "enum": [None, "no", "yes"]},
        "description": "yes only for test servers with self-signed certificates",
    },
}
_ODBC_BEHAVIOUR = {
    "hidden-fields": [],
    "relabeling": {"schema": "Database"},
    "placeholders": {"port": "1433", "login": "a user in db_owner (setup) or the CDC gating role"},
}


# The provider's Airflow configuration (``[cdc]``), declared as Airflow's own providers declare
# theirs: ``airflow config list`` shows it with its default and description.
_CONFIG = {
    "cdc": {
        "description": "Settings of the change data capture provider (airflow-provider-cdc).\n",
        "options": {
            "sqlserver_allow_driver_in_extra": {
                "description": "Whether a SQL Server connection's ``driver`` extra may choose the ODBC driver. "
                "unixODBC loads the library a driver names, so whoever can edit connections could run code on the "
                "workers: leave it False unless you trust them with that. When False, the DAG names the driver "
                "(``SqlServerCapture(odbc_driver=...)``, default ODBC Driver 18 for SQL Server) and a connection "
                "whose extra names another one is refused. Either way only an installed driver's name is accepted, "
                "never a path.\n",
                "version_added": "0.1.0",
                "type": "boolean",
                "example": None,
                "default": "False",
            }
        },
    }
}


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-cdc",
        "name": "Change Data Capture",
        "description": "Change data capture as scheduled, bounded windows: PostgreSQL logical "
        "replication, SQL Server CDC and YugabyteDB (logical replication or its CDC service) to "
        "Debezium-compatible change "
        "events, run on Spark.",
        "versions": [__version__],
        "documentation-url": DOCUMENTATION_URL,
        "config": _CONFIG,
        "integrations": [
            {
                "integration-name": "PostgreSQL change capture",
                "external-doc-url": "https://www.postgresql.org/docs/current/logical-replication.html",
                "tags": ["software"],
            },
            {
                "integration-name": "SQL Server change capture",
                "external-doc-url": "https://learn.microsoft.com/sql/relational-databases/track-changes/about-change-data-capture-sql-server",
                "tags": ["software"],
            },
            {
                "integration-name": "YugabyteDB change capture",
                "external-doc-url": "https://docs.yugabyte.com/stable/additional-features/change-data-capture/",
                "tags": ["software"],
            },
        ],
        "hooks": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": ["airflow_provider_cdc.hooks.postgres_cdc"],
            },
            {
                "integration-name": "SQL Server change capture",
                "python-modules": ["airflow_provider_cdc.hooks.sqlserver_cdc"],
            },
            {
                "integration-name": "YugabyteDB change capture",
                "python-modules": ["airflow_provider_cdc.hooks.yugabyte_cdc"],
            },
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_cdc.hooks.postgres_cdc.PostgresCdcHook",
                "hook-name": "PostgreSQL (change capture)",
                "connection-type": "postgres_cdc",
                "conn-fields": _LIBPQ_FIELDS,
                "ui-field-behaviour": _LIBPQ_BEHAVIOUR,
            },
            {
                "hook-class-name": "airflow_provider_cdc.hooks.sqlserver_cdc.SqlServerCdcHook",
                "hook-name": "SQL Server (change capture)",
                "connection-type": "mssql_cdc",
                "conn-fields": _ODBC_FIELDS,
                "ui-field-behaviour": _ODBC_BEHAVIOUR,
            },
            {
                "hook-class-name": "airflow_provider_cdc.hooks.yugabyte_cdc.YugabyteCdcHook",
                "hook-name": "YugabyteDB (change capture)",
                "connection-type": "yugabytedb_cdc",
                "conn-fields": _YUGABYTE_FIELDS,
                "ui-field-behaviour": _YUGABYTE_BEHAVIOUR,
            },
        ],
        "operators": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": [
                    "airflow_provider_cdc.operators.base",
                    "airflow_provider_cdc.operators.landing",
                    "airflow_provider_cdc.operators.setup",
                    "airflow_provider_cdc.operators.snapshot",
                    "airflow_provider_cdc.operators.window",
                    "airflow_provider_cdc.operators.current_state",
                    "airflow_provider_cdc.operators.slot_maintenance",
                    "airflow_provider_cdc.operators.query_extract",
                    "airflow_provider_cdc.operators.table_maintenance",
                ],
            },
            {
                "integration-name": "SQL Server change capture",
                "python-modules": ["airflow_provider_cdc.operators.sqlserver_health"],
            },
            {
                "integration-name": "YugabyteDB change capture",
                "python-modules": ["airflow_provider_cdc.operators.yugabyte_health"],
            },
        ],
        "sensors": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": ["airflow_provider_cdc.sensors.cdc"],
            }
        ],
        "triggers": [
            {
                "integration-name": "PostgreSQL change capture",
                "python-modules": ["airflow_provider_cdc.triggers.postgres_cdc"],
            },
            {
                "integration-name": "SQL Server change capture",
                "python-modules": ["airflow_provider_cdc.triggers.sqlserver_cdc"],
            },
            {
                "integration-name": "YugabyteDB change capture",
                "python-modules": [
                    "airflow_provider_cdc.triggers.yugabyte_cdc",
                    "airflow_provider_cdc.triggers.yugabyte_cdc_service",
                ],
            },
        ],
    }
