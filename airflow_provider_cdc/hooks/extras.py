"""A connection's extra as the hooks read it, whatever form wrote it.

Airflow's connection form stores a connection type's declared fields either under their own
names or, in older UIs, as ``extra__<conn_type>__<field>``; the hooks accept both, so a
``postgres_cdc`` connection made in the UI and a ``postgres`` one made from a URI read alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def connection_extras(conn: Any) -> dict[str, Any]:
    extra = dict(conn.extra_dejson or {})
    prefix = f"extra__{conn.conn_type}__" if getattr(conn, "conn_type", None) else None
    if prefix:
        for key in [k for k in extra if k.startswith(prefix)]:
            value = extra.pop(key)
            if value not in (None, ""):
                extra.setdefault(key[len(prefix) :], value)
    return {k: v for k, v in extra.items() if v not in (None, "")}


def scrubbed_test(test: Callable[[], tuple[bool, str]], *secrets: str | None) -> tuple[bool, str]:
    """A hook's ``test_connection`` result with the connection's secrets removed from its message:
    the UI shows it to whoever clicked "Test", and drivers sometimes echo what they were given."""
    try:
        status, message = test()
    except Exception as exc:  # a test reports, it does not raise (Airflow's Connection.test_connection)
        status, message = False, f"{type(exc).__name__}: {exc}"
    for secret in secrets:
        if secret:
            message = str(message).replace(secret, "***")
    return status, message
