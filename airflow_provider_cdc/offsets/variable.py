"""Offsets in Airflow Variables (the default store): no extra infrastructure."""

from __future__ import annotations

import json

from airflow_provider_cdc.offsets.base import StaleOffsetError
from airflow_provider_cdc.version_compat import Variable


class VariableOffsetStore:
    """One Variable per capture, named ``<key_prefix><topic_prefix>``.

    Airflow Variables have no compare-and-set, so the revision is checked by re-reading just
    before writing. Runs of one capture are already serialised by the capture lock; use the
    state-table store where a strict atomic compare-and-set matters.
    """

    def __init__(self, key_prefix: str = "cdc_offset__"):
        self.key_prefix = key_prefix

    def key(self, capture: str) -> str:
        return f"{self.key_prefix}{capture}"

    def load(self, capture: str) -> str | None:
        return Variable.get(self.key(capture), default=None)

    def save(self, capture: str, document: str, *, revision: int, expected_revision: int | None) -> None:
        current = self.load(capture)
        current_revision = _revision(current)
        if current_revision != expected_revision:
            raise StaleOffsetError(
                f"{self.describe(capture)} changed while this run was working (revision "
                f"{current_revision}, expected {expected_revision}); another run wrote it"
            )
        Variable.set(self.key(capture), document, description=f"airflow-provider-cdc offset of {capture}")

    def delete(self, capture: str) -> None:
        Variable.delete(self.key(capture))

    def describe(self, capture: str) -> str:
        return f"Airflow Variable {self.key(capture)!r}"


def _revision(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(json.loads(text).get("revision", 0))
    except (ValueError, AttributeError, TypeError):
        return -1
