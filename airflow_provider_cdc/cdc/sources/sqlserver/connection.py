"""How the engine reaches SQL Server: an ODBC connection string without the password.

The Airflow hook builds a :class:`SqlServerConnectionInfo` from an Airflow connection; the
engine only ever sees this value. Its password is excluded from ``repr``, equality and
serialisation: a job spec written to disk for ``spark-submit`` names an environment variable
instead. The driver is configurable: Microsoft's "ODBC Driver 18 for SQL Server" in production;
any ODBC driver that speaks to the server works the same way (the tests use another).

Whoever edits an Airflow connection must not be able to load code into the worker: unixODBC loads
the library a ``DRIVER`` names (a path as is) and runs its constructors, and the last ``DRIVER``
of a connection string wins. So the driver is only ever the name of an installed driver, the
extra's attributes come from an allowlist (none of them loads a file or changes whose identity
connects) with values that cannot leave their ``key=value;`` pair, and the connection's own
fields are braced (docs/sqlserver.md, "The Airflow connection").
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcTransientError
from airflow_provider_cdc.cdc.basics.tables import SQLSERVER_NAMES

logger = logging.getLogger(__name__)

DEFAULT_DRIVER = "ODBC Driver 18 for SQL Server"
#: Environment variable the job reads the password from when it runs out of process.
DEFAULT_PASSWORD_ENV = "AIRFLOW_CDC_SOURCE_PASSWORD"
#: What ends a ``key=value;`` pair or a braced value, or cuts the C string short.
_BREAKOUT = frozenset(";{}\x00\r\n")
#: What cuts a value short (NUL) or starts a new line in a driver's parser: in no value at all.
_CONTROL = frozenset("\x00\r\n")
#: Signs of a library where a driver name belongs: unixODBC loads a path, or a file it finds on the
#: library path, as the driver.
_LIBRARY_SIGNS = ("/", "\\", ".so", ".dll", ".dylib")


@dataclass(frozen=True)
class SqlServerConnectionInfo:
    host: str
    port: int | None
    database: str
    user: str
    password: str | None = field(default=None, repr=False, compare=False)
    driver: str = DEFAULT_DRIVER
    # Further ODBC attributes from the connection's extra (Encrypt, TrustServerCertificate, ...): only
    # MICROSOFT_ATTRIBUTES, in their documented spelling.
    options: tuple[tuple[str, str], ...] = ()
    password_env: str = DEFAULT_PASSWORD_ENV

    def __post_init__(self) -> None:
        if not self.database:
            raise CdcConfigurationError("the SQL Server connection names no database (set the connection's schema)")
        check_driver_name(self.driver)
        _check_host(self.host)
        for what, value in (("database", self.database), ("login", self.user), ("password", self.password)):
            if value and any(c in _CONTROL for c in value):  # the value itself is not shown: it may be a secret
                raise CdcConfigurationError(f"the connection's {what} must not contain line breaks or NUL characters")
        # The attributes in the driver's spelling, each once: which of two a driver takes is its own choice.
        options = tuple(checked_attribute(key, value) for key, value in self.options)
        twice = sorted({key for key, _ in options if sum(k == key for k, _ in options) > 1})
        if twice:
            raise CdcConfigurationError(
                f"ODBC attribute(s) {', '.join(twice)} set more than once in the connection's extra"
            )
        object.__setattr__(self, "options", options)

    @property
    def microsoft_driver(self) -> bool:
        """Microsoft's drivers take the port after the host (``SERVER=host,1433``); others a ``PORT`` key."""
        return "SQL Server" in self.driver

    def odbc(self) -> str:
        """The ODBC connection string including the password (never log it)."""
        parts = [("DRIVER", self.driver)]
        if self.microsoft_driver:
            parts.append(("SERVER", self.host if self.port is None else f"{self.host},{self.port}"))
        else:
            parts.append(("SERVER", self.host))
            if self.port is not None:
                parts.append(("PORT", str(self.port)))
        parts += [("DATABASE", self.database), ("UID", self.user)]
        if self.password is not None:
            parts.append(("PWD", self.password))
        parts += list(self.options)
        return "".join(f"{key}={_braced(value)};" for key, value in parts)

    def describe(self) -> str:
        """Where this connects, for messages and logs (no password)."""
        where = self.host if self.port is None else f"{self.host}:{self.port}"
        return f"{self.user}@{where}/{self.database}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form without the password."""
        return {
            "host": self.host,
            "port": self.port,
            "database": self.database,
            "user": self.user,
            "driver": self.driver,
            "options": [list(o) for o in self.options],
            "password_env": self.password_env,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SqlServerConnectionInfo:
        return cls(
            host=data["host"],
            port=None if data.get("port") is None else int(data["port"]),
            database=data["database"],
            user=data["user"],
            driver=data.get("driver", DEFAULT_DRIVER),
            options=tuple((str(k), str(v)) for k, v in data.get("options", ())),
            password_env=data.get("password_env", DEFAULT_PASSWORD_ENV),
        )

    def with_password_from_env(self) -> SqlServerConnectionInfo:
        """The same connection with the password read from :attr:`password_env`, if set."""
        password = os.environ.get(self.password_env)
        return self if password is None else replace(self, password=password)


def check_driver_name(driver: str) -> None:
    """``driver`` is a driver's name (an odbcinst.ini section), never a library: unixODBC loads a
    path, or a file on the library path, as is (whether it is installed is checked on connect)."""
    if (
        not isinstance(driver, str)
        or not driver.strip()
        or driver != driver.strip()
        or any(c in _BREAKOUT for c in driver)
        or any(sign in driver.lower() for sign in _LIBRARY_SIGNS)
    ):
        raise CdcConfigurationError(
            f"ODBC driver {driver!r} is not an ODBC driver name: give the name the driver is registered under in "
            f"odbcinst.ini (e.g. {DEFAULT_DRIVER!r}), without braces and never a path to a library"
        )


def check_installed(driver: str) -> None:
    """The driver is installed (registered in odbcinst.ini on this machine): the error names the
    installed ones. Without this, unixODBC would look for a library of that name."""
    import pyodbc

    installed = pyodbc.drivers()
    if driver not in installed:
        names = ", ".join(repr(name) for name in installed) or "none"
        raise CdcConfigurationError(
            f"ODBC driver {driver!r} is not installed on this worker (installed: {names}): give the name of an "
            "installed driver, or install the driver on the workers"
        )


def _check_host(host: str) -> None:
    """A host name or address, as SQL Server's drivers take it: ``[tcp:]host[,port]`` or ``host\\instance``."""
    if not host or any(c in _BREAKOUT or c.isspace() for c in host):
        raise CdcConfigurationError(
            f"the connection's host {host!r} is not a host name: give a name or an address (optionally tcp:host, "
            "host,port or host\\instance), without ; { } or white space"
        )


# -- the ODBC attributes a connection's extra may set ----------------------------------------------


@dataclass(frozen=True)
class OdbcAttribute:
    """An attribute a connection's extra may put in the connection string, and its values."""

    name: str  # the spelling the driver documents
    expected: str  # the values it takes, for messages
    accepts: Callable[[str], bool]


def _choice(name: str, *values: str) -> OdbcAttribute:
    lowered = {value.lower() for value in values}
    return OdbcAttribute(name, f"one of {', '.join(values)}", lambda value: value.lower() in lowered)


def _number(name: str, low: int, high: int) -> OdbcAttribute:
    def accepts(value: str) -> bool:
        return re.fullmatch(r"[0-9]{1,7}", value) is not None and low <= int(value) <= high

    return OdbcAttribute(name, f"a whole number from {low} to {high}", accepts)


def _matching(name: str, pattern: str, expected: str) -> OdbcAttribute:
    compiled = re.compile(pattern)
    return OdbcAttribute(name, expected, lambda value: compiled.fullmatch(value) is not None)


_YES_NO = ("yes", "no", "true", "false")
_HOST_NAME = r"(\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?"

#: Microsoft's ODBC Driver 17/18 for SQL Server ("DSN and Connection String Keywords and
#: Attributes"): how to reach and trust the server, nothing that reads or writes a file (Driver,
#: DSN, FileDSN, SaveFile, ServerCertificate, ClientCertificate, ClientKey, AttachDBFileName, the
#: log files), connects as someone else than the connection's login (Trusted_Connection, the
#: worker's Kerberos or managed identity, the key store credentials, so no ColumnEncryption either)
#: or changes how values read (AutoTranslate, Regional, LongAsMax, ...).
MICROSOFT_ATTRIBUTES: dict[str, OdbcAttribute] = {
    attribute.name.lower(): attribute
    for attribute in (
        _choice("Encrypt", *_YES_NO, "mandatory", "optional", "strict"),
        _choice("TrustServerCertificate", *_YES_NO),
        _matching("HostNameInCertificate", _HOST_NAME, "a host name (*.domain for a wildcard certificate)"),
        _choice("ApplicationIntent", "ReadOnly", "ReadWrite"),
        _choice("MultiSubnetFailover", *_YES_NO),
        _choice("TransparentNetworkIPResolution", "Enabled", "Disabled"),
        _choice("IpAddressPreference", "IPv4First", "IPv6First", "UsePlatformDefault"),
        # Only the ones that authenticate as the connection's own login and password.
        _choice("Authentication", "SqlPassword", "ActiveDirectoryPassword", "ActiveDirectoryServicePrincipal"),
        _number("ConnectRetryCount", 0, 255),
        _number("ConnectRetryInterval", 1, 60),
        _number("ConnectTimeout", 0, 3600),
        _number("KeepAlive", 1, 86400),
        _number("KeepAliveInterval", 1, 86400),
        _matching("APP", r"[^;{}\x00-\x1f\x7f]{1,128}", "text without ; { } or control characters (up to 128)"),
    )
}

#: Why the keys editors try most are refused (any key outside the allowlist is).
_REFUSED_BECAUSE = {
    "driver": "the driver comes from the DAG (odbc_driver), or from the 'driver' extra where the deployment allows it",
    "dsn": "a data source names its own driver and settings",
    "filedsn": "a file data source names its own driver and settings",
    "savefile": "it writes the connection string, password included, to a file",
    "server": "the connection's host field is the server",
    "address": "the connection's host field is the server",
    "addr": "the connection's host field is the server",
    "port": "the connection's port field is the port",
    "database": "the connection's schema field is the database",
    "uid": "the connection's login field is the user",
    "pwd": "the connection's password field is the password",
    "trusted_connection": "it connects as the worker's own identity, not the connection's login",
}


def checked_attribute(key: str, value: str) -> tuple[str, str]:
    """``(key, value)`` as the connection string gets it (the documented spelling), or an error
    naming the allowed keys or the expected values. Values are never shown: an editor may have put
    a secret in the wrong field. The allowlist is the same whichever the driver: another driver's
    own settings belong in its odbcinst.ini entry on the workers, not in a connection."""
    allowed = MICROSOFT_ATTRIBUTES
    attribute = allowed.get(key.lower()) if isinstance(key, str) else None
    if attribute is None:
        because = _REFUSED_BECAUSE.get(str(key).strip().lower())
        raise CdcConfigurationError(
            f"ODBC attribute {key!r} of the connection's extra is not allowed"
            + (f" ({because})" if because else "")
            + f"; allowed: {', '.join(a.name for a in allowed.values())}. Remove it from the connection's extra"
        )
    if not isinstance(value, str) or any(c in _BREAKOUT for c in value) or not attribute.accepts(value):
        raise CdcConfigurationError(
            f"ODBC attribute {attribute.name!r} of the connection's extra must be {attribute.expected} "
            "(the value given is not shown)"
        )
    return attribute.name, value


def _braced(value: str) -> str:
    """An ODBC attribute value, braced when it contains characters the syntax treats specially."""
    if value and not any(c in value for c in ";{}=") and value.strip() == value:
        return value
    return "{" + value.replace("}", "}}") + "}"


def connect(
    info: SqlServerConnectionInfo, *, autocommit: bool = True, login_timeout: int = 0, query_timeout: int = 0
):  # -> pyodbc.Connection
    """A pyodbc connection; errors name the server, never the password. ``login_timeout``:
    seconds ODBC waits for the server to accept the login (0: the driver's default).
    ``query_timeout``: seconds each statement may take before the driver cancels it (pyodbc's
    ``Connection.timeout``: ODBC's ``SQL_ATTR_QUERY_TIMEOUT`` on every cursor; 0: no limit): the
    login timeout does not cover a server that accepts the login and then stalls. pyodbc sets it
    through ``SQL_ATTR_CONNECTION_TIMEOUT``, which Microsoft's drivers take; a driver that refuses
    it (psqlODBC) gets none, so a caller that must not block uses its own deadline as well."""
    import pyodbc

    check_installed(info.driver)
    try:
        conn = pyodbc.connect(info.odbc(), autocommit=autocommit, timeout=login_timeout)
    except pyodbc.Error as exc:
        message = error_message(exc)
        if info.password:
            message = message.replace(info.password, "***")
        raise CdcTransientError(f"cannot connect to SQL Server at {info.describe()}: {message}") from None
    if query_timeout:
        try:
            conn.timeout = query_timeout
        except pyodbc.Error as exc:
            logger.debug("the ODBC driver of %s takes no query timeout: %s", info.describe(), error_message(exc))
    return conn


#: The ``(208)`` that ends a diagnostic record: before ``;`` (the next record), the driver's
#: ``(SQLExecDirectW)`` or the end; not a ``(2)`` inside the message, e.g. in an object's name.
_ERROR_NUMBER = re.compile(r"\((\d+)\)(?=\s*(?:;|\(SQL\w*\)|$))")


def error_number(exc: BaseException) -> int | None:
    """SQL Server's error number from a pyodbc error (the ``(313)`` its message ends with)."""
    found = _ERROR_NUMBER.findall(error_message(exc))
    return int(found[0]) if found else None


def server_said(exc: BaseException) -> str:
    """The server's message of a driver error, up to its error number (without the driver's words)."""
    message = error_message(exc)
    found = re.match(r"^(?:ERROR:\s*)?(.*?\(\d+\))", message)
    return found.group(1) if found else message


def error_message(exc: BaseException) -> str:
    """A pyodbc error's message without the driver's bracketed prefixes."""
    args = getattr(exc, "args", ())
    text = str(args[1]) if len(args) > 1 else str(exc)
    text = re.sub(r"^(\[[^\]]*\])+\s*", "", text.strip())
    return " ".join(text.split()) or type(exc).__name__


def quote(name: str) -> str:
    return SQLSERVER_NAMES.quote(name)


def rows(conn: Any, statement: str, *params: Any) -> list[tuple]:
    cursor = conn.cursor()
    try:
        cursor.execute(statement, *params)
        return [tuple(r) for r in cursor.fetchall()]
    finally:
        cursor.close()


def value(conn: Any, statement: str, *params: Any) -> Any:
    found = rows(conn, statement, *params)
    return found[0][0] if found else None


#: The database user the capture login maps to (the grantee of the grants the checks name).
USER_SQL = "SELECT USER_NAME()"
