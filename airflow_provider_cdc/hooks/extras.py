"""A connection's extra as the hooks read it, whatever form wrote it.

Airflow's connection form stores a connection type's declared fields either under their own
names or, in older UIs, as ``extra__<conn_type>__<field>``; the hooks accept both, so a
``postgres_cdc`` connection made in the UI and a ``postgres`` one made from a URI read alike.
"""

from __future__ import annotations

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
