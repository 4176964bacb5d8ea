"""How the engine reaches PostgreSQL: connection parameters without leaking the password.

The Airflow hook builds a :class:`PgConnectionInfo` from an Airflow connection; the engine
only ever sees this value. Its password is excluded from ``repr``, equality and serialisation:
a job spec written to disk for ``spark-submit`` names an environment variable instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres.types import SESSION_SETTINGS

#: libpq parameters a capture connection may carry besides host/port/dbname/user/password.
ALLOWED_OPTIONS = (
    "sslmode",
    "sslcert",
    "sslkey",
    "sslrootcert",
    "sslcrl",
    "connect_timeout",
    "application_name",
    "target_session_attrs",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
)

#: Environment variable the job reads the password from when it runs out of process.
DEFAULT_PASSWORD_ENV = "AIRFLOW_CDC_SOURCE_PASSWORD"


@dataclass(frozen=True)
class PgConnectionInfo:
    host: str
    port: int
    dbname: str
    user: str
    password: str | None = field(default=None, repr=False, compare=False)
    options: tuple[tuple[str, str], ...] = ()
    password_env: str = DEFAULT_PASSWORD_ENV

    def __post_init__(self) -> None:
        unknown = sorted({key for key, _ in self.options} - set(ALLOWED_OPTIONS))
        if unknown:
            raise CdcConfigurationError(
                f"unsupported connection option(s) {unknown}; allowed: {', '.join(ALLOWED_OPTIONS)}"
            )
        if not self.dbname:
            raise CdcConfigurationError("the PostgreSQL connection names no database")

    def conninfo(self, *, replication: bool = False) -> str:
        """A libpq connection string including the password (never log it)."""
        from psycopg.conninfo import make_conninfo

        params: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "dbname": self.dbname,
            "user": self.user,
            "options": session_options(),
            "application_name": "airflow-provider-cdc",
            **dict(self.options),
        }
        if self.password is not None:
            params["password"] = self.password
        if replication:
            params["replication"] = "database"
        return make_conninfo("", **params)

    def describe(self) -> str:
        """Where this connects, for messages and logs (no password)."""
        return f"{self.user}@{self.host}:{self.port}/{self.dbname}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form without the password."""
        return {
            f.name: ([list(o) for o in self.options] if f.name == "options" else getattr(self, f.name))
            for f in fields(self)
            if f.name != "password"
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PgConnectionInfo:
        return cls(
            host=data["host"],
            port=int(data["port"]),
            dbname=data["dbname"],
            user=data["user"],
            options=tuple((str(k), str(v)) for k, v in data.get("options", ())),
            password_env=data.get("password_env", DEFAULT_PASSWORD_ENV),
        )

    def with_password_from_env(self) -> PgConnectionInfo:
        """The same connection with the password read from :attr:`password_env`, if set."""
        password = os.environ.get(self.password_env)
        return self if password is None else replace(self, password=password)


def session_options() -> str:
    return " ".join(f"-c {key}={value.replace(' ', '')}" for key, value in SESSION_SETTINGS.items())


def connect(info: PgConnectionInfo, *, autocommit: bool = True):  # -> psycopg.Connection
    """A regular (non-replication) psycopg connection with the capture's session settings."""
    import psycopg

    from airflow_provider_cdc.cdc.errors import CdcTransientError

    try:
        return psycopg.connect(info.conninfo(), autocommit=autocommit)
    except psycopg.OperationalError as exc:
        message = first_line(exc)
        if "permission denied for database" in message:
            quoted = ['"' + name.replace('"', '""') + '"' for name in (info.dbname, info.user)]
            message += f". Run: GRANT CONNECT ON DATABASE {quoted[0]} TO {quoted[1]}"
        raise CdcTransientError(f"cannot connect to PostgreSQL at {info.describe()}: {message}") from None


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (psycopg adds DETAIL/HINT/CONTEXT lines), or its type."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
