"""How the engine reaches SQL Server: an ODBC connection string without the password.

The Airflow hook builds a :class:`SqlServerConnectionInfo` from an Airflow connection; the
engine only ever sees this value. Its password is excluded from ``repr``, equality and
serialisation: a job spec written to disk for ``spark-submit`` names an environment variable
instead. The driver is configurable: Microsoft's "ODBC Driver 18 for SQL Server" in production;
any ODBC driver that speaks to the server works the same way (the tests use another).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_cdc.cdc.errors import CdcConfigurationError, CdcTransientError

DEFAULT_DRIVER = "ODBC Driver 18 for SQL Server"
#: Environment variable the job reads the password from when it runs out of process.
DEFAULT_PASSWORD_ENV = "AIRFLOW_CDC_SOURCE_PASSWORD"
#: Keys the connection string builds itself; extras may not override them.
_RESERVED = frozenset({"driver", "server", "port", "database", "uid", "pwd", "dsn"})
_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9 _-]*$")


@dataclass(frozen=True)
class SqlServerConnectionInfo:
    host: str
    port: int | None
    database: str
    user: str
    password: str | None = field(default=None, repr=False, compare=False)
    driver: str = DEFAULT_DRIVER
    # Further ODBC attributes passed verbatim (Encrypt, TrustServerCertificate, ApplicationIntent, ...).
    options: tuple[tuple[str, str], ...] = ()
    password_env: str = DEFAULT_PASSWORD_ENV

    def __post_init__(self) -> None:
        if not self.database:
            raise CdcConfigurationError("the SQL Server connection names no database (set the connection's schema)")
        if not self.driver or any(c in self.driver for c in "{};"):
            raise CdcConfigurationError(f"ODBC driver name {self.driver!r} is invalid")
        for key, value in self.options:
            if not _KEY.match(key) or key.lower() in _RESERVED:
                raise CdcConfigurationError(
                    f"ODBC connection option {key!r} is not allowed (reserved: {', '.join(sorted(_RESERVED))})"
                )
            if "\x00" in value:
                raise CdcConfigurationError(f"ODBC connection option {key!r} has a NUL character")

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


def _braced(value: str) -> str:
    """An ODBC attribute value, braced when it contains characters the syntax treats specially."""
    if value and not any(c in value for c in ";{}=") and value.strip() == value:
        return value
    return "{" + value.replace("}", "}}") + "}"


def connect(info: SqlServerConnectionInfo, *, autocommit: bool = True):  # -> pyodbc.Connection
    """A pyodbc connection; errors name the server, never the password."""
    import pyodbc

    try:
        conn = pyodbc.connect(info.odbc(), autocommit=autocommit)
    except pyodbc.Error as exc:
        message = error_message(exc)
        if info.password:
            message = message.replace(info.password, "***")
        raise CdcTransientError(f"cannot connect to SQL Server at {info.describe()}: {message}") from None
    return conn


def error_number(exc: BaseException) -> int | None:
    """SQL Server's error number from a pyodbc error (the ``(313)`` its message ends with)."""
    found = re.findall(r"\((\d+)\)", error_message(exc))
    return int(found[0]) if found else None


def error_message(exc: BaseException) -> str:
    """A pyodbc error's message without the driver's bracketed prefixes."""
    args = getattr(exc, "args", ())
    text = str(args[1]) if len(args) > 1 else str(exc)
    text = re.sub(r"^(\[[^\]]*\])+\s*", "", text.strip())
    return " ".join(text.split()) or type(exc).__name__
