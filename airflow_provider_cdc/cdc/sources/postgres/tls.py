"""TLS of PostgreSQL connections: verified where the server offers it, weaker only when asked.

A connection whose Airflow extra sets no ``sslmode`` (nor the ``PGSSLMODE`` environment variable)
gets the product's default, *verified TLS where offered*: libpq's ``sslmode=verify-full``, the
server's certificate checked against the extra's ``sslrootcert``, else libpq's own default file
(``PGSSLROOTCERT``, ``~/.postgresql/root.crt``), else the system's trusted roots. A certificate
that does not verify is an error, never a fallback.

A server that answers it has no TLS at all is refused, unless it is on this host: that answer is
not authenticated (it comes before any handshake), so a man in the middle can give it for a
server that has TLS and relay the session in clear text, password and rows included. Only a
server on the worker's own host (a Unix socket or a loopback address: no network is crossed) gets
the fall back to plain TCP, with a WARNING that it is unencrypted; not even then when the extra
names TLS files (``sslrootcert``, ``sslcert``, ...): TLS was meant. Anywhere else the error says
to turn TLS on at the server or, for a network the deployment trusts, to set ``sslmode=disable``
(or ``prefer``) in the connection's extra: weaker modes only when set explicitly.

An explicit ``sslmode`` is used as given. Weaker than ``verify-full`` it is logged once, naming
what is not checked (at WARNING; at INFO for a server on this host: a Unix socket or a loopback
address, as behind a local proxy or tunnel, where nothing crosses a network).

The first connection of a process settles the mode (and logs); the process's later connections
reuse it without probing or logging again. The Airflow side hands the settled mode to Spark
jobs in the job spec (:attr:`PgConnectionInfo.resolved_sslmode`), so their partitions connect
the same way without probing.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError


class TlsTarget(Protocol):
    """What the TLS rules read of a connection: :class:`.connection.PgConnectionInfo` is one (the
    connection module builds on these rules, so they name its fields, not its class)."""

    host: str
    port: int
    dbname: str
    user: str
    options: tuple[tuple[str, str], ...]
    resolved_sslmode: str | None

    def conninfo(self, *, replication: bool = False) -> str: ...

    def describe(self) -> str: ...


log = logging.getLogger(__name__)

#: libpq's sslmode values, weakest first.
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: The mode of a connection that sets none.
DEFAULT_SSLMODE = "verify-full"

#: What each TLS mode weaker than verify-full leaves unchecked (disable: see CLEAR_TEXT).
WEAKNESS = {
    "allow": (
        "TLS is used only if the server demands it and the server's certificate is not verified: a man in the "
        "middle can keep the connection unencrypted or present any certificate"
    ),
    "prefer": (
        "the server's certificate is not verified and TLS is given up if the server does not offer it: a man "
        "in the middle can downgrade the connection to clear text or present any certificate"
    ),
    "require": "the server's certificate is not verified: a man in the middle can present any certificate",
    "verify-ca": (
        "the server's host name is not checked against its certificate: any server holding a certificate "
        "from the trusted CA is accepted"
    ),
}

#: What an unencrypted connection exposes.
CLEAR_TEXT = (
    "queries and captured rows cross the network in clear text, and so does the password unless the server "
    "authenticates with SCRAM"
)

# libpq's answer when sslmode requires TLS and the server says it has none.
_NO_TLS = "server does not support SSL"
# libpq's answers when the server's certificate cannot be verified (or verification cannot start).
_UNVERIFIED = (
    "certificate verify failed",
    "does not match host name",
    "root certificate file",
    "could not get server's host name from server certificate",
    "may not be used with sslrootcert=system",
    "could not load system root certificate",
)

# Extras that only mean something over TLS: a connection naming one without an sslmode wants TLS.
_TLS_FILES = ("sslrootcert", "sslcert", "sslkey", "sslcrl")

_settled: dict[tuple, str] = {}
_settled_lock = threading.Lock()

C = TypeVar("C")


def explicit_sslmode(info: TlsTarget) -> tuple[str | None, str]:
    """(the sslmode the connection asks for, where it was set); None: the product's default."""
    mode = dict(info.options).get("sslmode")
    if mode:
        return mode, "in the connection's extra"
    mode = os.environ.get("PGSSLMODE")
    return (mode, "by PGSSLMODE") if mode else (None, "")


def effective_sslmode(info: TlsTarget) -> str:
    """The sslmode a connection with ``info`` is opened with."""
    mode = dict(info.options).get("sslmode") or info.resolved_sslmode or explicit_sslmode(info)[0]
    return mode or DEFAULT_SSLMODE


def check_sslmode(mode: str) -> None:
    if mode not in SSLMODES:
        raise CdcConfigurationError(f"unknown sslmode {mode!r}; libpq's modes are {', '.join(SSLMODES)}")


def tls_params(info: TlsTarget) -> dict[str, str]:
    """The ``sslmode`` (and default ``sslrootcert``) to add to the connection string."""
    mode = effective_sslmode(info)
    params = {"sslmode": mode}
    if mode == "verify-full" and not dict(info.options).get("sslrootcert"):
        roots = default_root_cert()
        if roots is not None:
            params["sslrootcert"] = roots
    return params


def default_root_cert() -> str | None:
    """The ``sslrootcert`` of a verify-full connection whose extra names none: None where libpq
    has a file of its own to use (``PGSSLROOTCERT``, ``~/.postgresql/root.crt``), else the
    system's trusted roots: the CA bundle OpenSSL would use (``SSL_CERT_FILE``, else the
    platform's default file) named as a file, since the OpenSSL inside psycopg's binary wheel
    looks for the system's roots in a directory of its own build; else ``system`` (libpq 16+)."""
    if os.environ.get("PGSSLROOTCERT") or Path(os.path.expanduser("~/.postgresql/root.crt")).exists():
        return None
    bundle = ssl.get_default_verify_paths().cafile
    if bundle:
        return bundle
    from psycopg import pq

    return "system" if pq.version() >= 160000 else None


def is_local(host: str) -> bool:
    """Whether every host of a libpq ``host`` list is this machine: a Unix socket directory or a
    loopback address (``localhost`` included)."""
    hosts = [h.strip() for h in (host or "").split(",")] or [""]
    return all(_is_local_host(h) for h in hosts)


def _is_local_host(host: str) -> bool:
    if not host or host.startswith(("/", "@")) or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def open_connection(
    info: TlsTarget,
    attempt: Callable[[TlsTarget], C],
    ssl_in_use: Callable[[C], bool],
) -> C:
    """``attempt(info)`` (it opens a connection with ``info.conninfo()``, raising an error whose
    text is libpq's message when it fails) with this module's TLS rules; see the module doc."""
    if info.resolved_sslmode is None:
        known = _settled.get(_key(info))
        if known is not None:
            info = replace(info, resolved_sslmode=known)
    if info.resolved_sslmode is not None:  # settled already: no probe, nothing more to log
        return _verified(info, attempt)
    mode, where = explicit_sslmode(info)
    if mode is not None:
        check_sslmode(mode)
        conn = _verified(info, attempt)
        _report_explicit(info, mode, where, ssl_in_use(conn))
        _settle(info, mode)
        return conn
    try:
        conn = _verified(info, attempt)
    except CdcConfigurationError:
        raise
    except Exception as exc:
        if _NO_TLS not in str(exc):
            raise
        files = [name for name in _TLS_FILES if dict(info.options).get(name)]
        if not is_local(info.host):  # an unauthenticated "no TLS" across a network: maybe a downgrade
            raise CdcConfigurationError(
                f"cannot connect to PostgreSQL at {info.describe()}: the server at {info.host}:{info.port} offers no "
                "TLS. The connection sets no sslmode, so it asks for verified TLS (verify-full), and it was not "
                "retried in clear text: the server's answer that it has no TLS is not authenticated, and a man in "
                "the middle can give it to read the session, password included. Turn TLS on at the server (ssl = on; "
                "name its CA in 'sslrootcert'); or, if the network between the workers and it is trusted, set "
                "sslmode=disable (or prefer) in the connection's extra explicitly"
            ) from None
        if files:  # TLS was meant: no clear text behind the user's back
            raise CdcConfigurationError(
                f"cannot connect to PostgreSQL at {info.describe()}: the server does not offer TLS, and the "
                f"connection's extra names TLS files ({', '.join(files)}) but no sslmode, so it was not retried "
                "in clear text. Turn TLS on at the server (ssl = on), or set 'sslmode' to 'disable' in the "
                "connection's extra to connect unencrypted knowingly"
            ) from None
        log.warning(
            "PostgreSQL connection %s is unencrypted: the server, on this host (a Unix socket or a loopback "
            "address), does not offer TLS. The connection sets no sslmode, so verified TLS (verify-full) was tried "
            "first; on this host no network is crossed, so it falls back to plain TCP (a server elsewhere without "
            "TLS is refused). Turn TLS on at the server (ssl = on), or set 'sslmode' in the connection's extra: "
            "'verify-full' to refuse unencrypted connections, 'disable' to connect in clear text knowingly "
            "without trying TLS.",
            info.describe(),
        )
        conn = attempt(replace(info, resolved_sslmode="disable"))
        _settle(info, "disable")
        return conn
    _settle(info, DEFAULT_SSLMODE)
    return conn


def resolve(info: TlsTarget, connect: Callable[[TlsTarget], Any]) -> TlsTarget:
    """``info`` with :attr:`~PgConnectionInfo.resolved_sslmode` set: the mode this process
    settled on, connecting once (``connect(info)``, closed at once) if it has not yet."""
    if info.resolved_sslmode is not None:
        return info
    known = _settled.get(_key(info))
    if known is None:
        connect(info).close()
        known = _settled.get(_key(info), effective_sslmode(info))
    return replace(info, resolved_sslmode=known)


def forget() -> None:
    """Forget the modes settled in this process (tests)."""
    with _settled_lock:
        _settled.clear()


def verification_error(info: TlsTarget, message: str) -> CdcConfigurationError | None:
    """The error to raise for libpq's ``message`` if it says the server's certificate could not
    be verified (retrying cannot help; falling back to clear text must not)."""
    if not any(sign in message for sign in _UNVERIFIED):
        return None
    mode = effective_sslmode(info)
    roots = dict(info.options).get("sslrootcert") or tls_params(info).get("sslrootcert")
    roots = roots or os.environ.get("PGSSLROOTCERT") or "~/.postgresql/root.crt"
    origin = "the default" if explicit_sslmode(info)[0] is None else "as set"
    return CdcConfigurationError(
        f"cannot connect to PostgreSQL at {info.describe()}: the server's TLS certificate could not be verified "
        f"({message}; sslmode={mode}, {origin}; trusted roots: {roots}). The connection was not retried without "
        "TLS. Set 'sslrootcert' in the connection's extra to the CA certificate (a PEM file on the Airflow "
        "workers and Spark hosts) that signed the server's certificate, or, knowing that the server is then "
        "not authenticated, a weaker 'sslmode' such as 'require'"
    )


def _verified(info: TlsTarget, attempt: Callable[[TlsTarget], C]) -> C:
    try:
        return attempt(info)
    except Exception as exc:
        error = verification_error(info, _libpq_message(exc))
        if error is None:
            raise
        raise error from None


def _libpq_message(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    marker = " failed: "
    return text.rsplit(marker, 1)[1] if marker in text else text


def _report_explicit(info: TlsTarget, mode: str, where: str, encrypted: bool) -> None:
    if mode == "verify-full":
        return
    level = logging.INFO if is_local(info.host) else logging.WARNING
    if mode == "disable" or not encrypted:
        log.log(
            level,
            "PostgreSQL connection %s is unencrypted (sslmode=%s, set %s): %s. Set sslmode=verify-full, with "
            "the server's CA in sslrootcert, to require verified TLS.",
            info.describe(),
            mode,
            where,
            CLEAR_TEXT,
        )
        return
    log.log(
        level,
        "PostgreSQL connection %s uses TLS with sslmode=%s (set %s): %s. Set sslmode=verify-full, with the "
        "server's CA in sslrootcert, to verify the server.",
        info.describe(),
        mode,
        where,
        WEAKNESS[mode],
    )


def _settle(info: TlsTarget, mode: str) -> None:
    with _settled_lock:
        _settled[_key(info)] = mode


def _key(info: TlsTarget) -> tuple:
    return (info.host, info.port, info.dbname, info.user, info.options, os.environ.get("PGSSLMODE"))
