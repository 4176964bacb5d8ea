"""How the engine reaches PostgreSQL: connection parameters without leaking the password.

The Airflow hook builds a :class:`PgConnectionInfo` from an Airflow connection; the engine
only ever sees this value. Its password is excluded from ``repr``, equality and serialisation:
a job spec written to disk for ``spark-submit`` names an environment variable instead.

Connections use verified TLS unless the connection asks for less (see :mod:`.tls`): the sslmode
the Airflow side settled on travels in the job spec as :attr:`PgConnectionInfo.resolved_sslmode`.

**Whoever edits the Airflow connection chooses only what** :data:`ALLOWED_OPTIONS` **lists.** An
editor is trusted with where the capture connects and as whom, not with what runs in the worker
or in the capture's sessions. So the allowlist leaves out every libpq parameter that loads code,
reads a file that changes who connects or what the session runs, or weakens what the product
pins: ``options`` (server settings for the session: ``-c search_path=...`` would undo the pinned
search_path below, ``-c row_security=on`` the refusal of policies), ``service``/``servicefile``
(a file of more parameters, any of them), ``passfile`` and ``sslpassword`` (credentials from a file
or for a key the editor names), ``gssencmode``, ``gsslib``, ``krbsrvname``, ``gssdelegation``
(Kerberos: another identity, delegated credentials), ``require_auth``, ``channel_binding``,
``sslcertmode``, ``sslcrldir``, ``sslcompression``, ``ssl_min_protocol_version``/``max``,
``sslsni``, ``sslnegotiation`` (the handshake and its checks are the product's), ``requirepeer``,
``hostaddr``, ``load_balance_hosts``, ``replication``, ``client_encoding`` and the OAuth
parameters. Of those it lists, ``sslkey`` is checked: libpq reads ``engine:key`` there and has
OpenSSL load the engine, a shared library named by the editor, into the worker, so a ``:`` is
refused. ``sslcert``, ``sslkey``, ``sslrootcert`` and ``sslcrl`` name files on the workers that
libpq reads as a certificate, key, CA or CRL and nothing else. libpq's environment (``PGSSLKEY``,
``PGSERVICEFILE``, ``PGOPTIONS`` ...) is the deployment's: only explicit parameters override it, and
the product sets ``options`` itself.

**Every capture session runs with** :data:`SECURITY_SETTINGS`, sent at connection start (so no
``ALTER DATABASE``/``ALTER ROLE ... SET`` by a database's owner overrides them):
``search_path = pg_catalog, pg_temp``, so no function, operator or type the capture's SQL names
unqualified resolves to another role's object (tables are always schema-qualified), and
``row_security = off``, so a read that a row level security policy would filter fails with an
error instead of running the policy's expression as the capture role and silently dropping rows
(superusers, roles with ``BYPASSRLS`` and table owners are not subject to policies).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres import tls
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

#: Settings that keep other roles' code out of every capture session (see the module docstring).
SECURITY_SETTINGS: dict[str, str] = {"search_path": "pg_catalog, pg_temp", "row_security": "off"}

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
    # The sslmode the Airflow side settled on (and logged about) for this connection: its own, or
    # the default's outcome (verify-full; disable where the server offers no TLS). Set, the job
    # connects with it and neither probes nor logs again. Not a secret: it is in the job spec.
    resolved_sslmode: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted({key for key, _ in self.options} - set(ALLOWED_OPTIONS))
        if unknown:
            raise CdcConfigurationError(
                f"unsupported connection option(s) {unknown}; allowed: {', '.join(ALLOWED_OPTIONS)}"
            )
        for mode in (dict(self.options).get("sslmode"), self.resolved_sslmode):
            if mode:
                tls.check_sslmode(mode)
        check_sslkey(dict(self.options).get("sslkey"))
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
            "application_name": "airflow-provider-cdc",
            **dict(self.options),
            # After the extras: the session's settings and TLS are the product's, never an extra's.
            "options": session_options(),
            **tls.tls_params(self),
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
            resolved_sslmode=data.get("resolved_sslmode"),
        )

    def with_password_from_env(self) -> PgConnectionInfo:
        """The same connection with the password read from :attr:`password_env`, if set."""
        password = os.environ.get(self.password_env)
        return self if password is None else replace(self, password=password)


def session_options() -> str:
    """libpq's ``options``: the capture's value formats and :data:`SECURITY_SETTINGS`."""
    settings = {**SESSION_SETTINGS, **SECURITY_SETTINGS}
    return " ".join(f"-c {key}={value.replace(' ', '')}" for key, value in settings.items())


def quote_literal(text: str) -> str:
    """``text`` as an SQL string literal, whatever ``standard_conforming_strings`` is."""
    if "\x00" in text:
        raise ValueError("a string literal cannot contain NUL")
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


@dataclass(frozen=True)
class SessionSettings:
    """What a session sets when it starts, where the server has the setting (an older server lacks
    some; a setting it lacks changes nothing there): ``exact`` values, and ``minimums``, integers in
    the setting's own unit that raise a lower value and keep a higher one (a DBA's or a role's)."""

    exact: Mapping[str, str] = field(default_factory=dict)
    minimums: Mapping[str, int] = field(default_factory=dict)

    def with_exact(self, **values: str) -> SessionSettings:
        return SessionSettings({**self.exact, **values}, self.minimums)

    def statement(self) -> str | None:
        """One statement that applies them, as SQL text (it also runs on a replication connection
        and through ADBC, neither of which takes parameters here); None when there are none."""
        rows = [f"({quote_literal(name)}, {quote_literal(value)}, false)" for name, value in self.exact.items()]
        rows += [f"({quote_literal(name)}, '{int(value)}', true)" for name, value in self.minimums.items()]
        if not rows:
            return None
        value = "CASE WHEN v.minimum THEN greatest(s.setting::bigint, v.value::bigint)::text ELSE v.value END"
        return (
            f"SELECT pg_catalog.set_config(s.name, {value}, false) FROM (VALUES {', '.join(rows)}) "
            "AS v(name, value, minimum) JOIN pg_catalog.pg_settings s ON s.name = v.name"
        )


def decoding_settings(work_mem_bytes: int | None) -> SessionSettings:
    """The settings of a session that decodes a window: ``logical_decoding_work_mem`` at least
    ``work_mem_bytes`` (the setting's unit is kB), or none to keep the server's as it is."""
    if work_mem_bytes is None:
        return SessionSettings()
    return SessionSettings(minimums={"logical_decoding_work_mem": int(work_mem_bytes) // 1024})


def check_sslkey(sslkey: str | None) -> None:
    """Refuse libpq's ``engine:key`` form of ``sslkey``: OpenSSL would load the engine (any shared
    library the connection's editor names) into the worker to get the key."""
    if sslkey and ":" in sslkey:
        raise CdcConfigurationError(
            f"the connection's sslkey {sslkey!r} contains ':', which libpq reads as an OpenSSL engine and a key "
            "in it ('engine:key'): the engine, a shared library, would be loaded into the worker. Name the client "
            "key's file (PEM) on the workers, by a path without ':'"
        )


def row_security_refusal(exc: BaseException, user: str) -> CdcConfigurationError | None:
    """The error to raise for a read the server refused because a row level security policy
    applies to the capture role (the sessions run with ``row_security = off``), else None."""
    message = first_line(exc)
    if "would be affected by row-level security policy" not in message:
        return None
    role = '"' + user.replace('"', '""') + '"'
    return CdcConfigurationError(
        f"{message}: row level security applies to the capture role {user!r}, and its sessions run with "
        "row_security = off, so the table is not read through its policies (they would drop rows from the capture "
        "without a trace, and run their expressions as the capture role, which holds REPLICATION). The capture "
        "reads every row of a captured table (logical decoding does anyway): have a superuser run ALTER ROLE "
        f"{role} BYPASSRLS, or the table's owner ALTER TABLE ... DISABLE ROW LEVEL SECURITY (and NO FORCE ROW "
        "LEVEL SECURITY where the capture role owns it)"
    )


def connect(info: PgConnectionInfo, *, autocommit: bool = True):  # -> psycopg.Connection
    """A regular (non-replication) psycopg connection with the capture's session settings, over
    verified TLS unless the connection asks for less (see :mod:`.tls`)."""
    import psycopg

    from airflow_provider_cdc.cdc.basics.errors import CdcTransientError

    try:
        return tls.open_connection(
            info,
            lambda attempt: psycopg.connect(attempt.conninfo(), autocommit=autocommit),
            lambda conn: bool(conn.pgconn.ssl_in_use),
        )
    except psycopg.OperationalError as exc:
        message = first_line(exc)
        if "permission denied for database" in message:
            quoted = ['"' + name.replace('"', '""') + '"' for name in (info.dbname, info.user)]
            message += f". Run: GRANT CONNECT ON DATABASE {quoted[0]} TO {quoted[1]}"
        raise CdcTransientError(f"cannot connect to PostgreSQL at {info.describe()}: {message}") from None


def resolve_tls(info: PgConnectionInfo) -> PgConnectionInfo:
    """``info`` with the sslmode this process settled on for it (connecting once if it has not
    yet): what a job spec carries, so Spark's partitions connect alike without probing."""
    return tls.resolve(info, connect)


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (psycopg adds DETAIL/HINT/CONTEXT lines), or its type."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
