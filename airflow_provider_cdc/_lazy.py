"""Engine modules the DAG-facing modules load on first use, not when a DAG file is parsed.

Airflow re-imports a provider on every parse of every DAG file (it pre-imports only ``airflow.*``),
so whatever the captures, operators and sensors import at the top is paid again and again by the
DAG processor. The source engines need pyarrow, numpy, pandas and the database drivers (~1 s and
~100 MB); a capture needs them only when a task runs. ``lazy_module`` returns a stand-in that
imports the module on the first attribute access, so the code that uses it stays as written
(``admin.slot_status(...)``). ``tests/unit/test_import_boundaries.py`` checks that parsing the
example DAGs loads none of them.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """A module imported on first attribute access (``importlib.import_module``: thread-safe,
    and a ``sys.modules`` lookup once the module is loaded)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_module(name: str) -> Any:
    """Module ``name``, imported when one of its attributes is first used."""
    return LazyModule(name)
