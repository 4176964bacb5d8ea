"""docs/types.md is what the provider really produces (regenerated against a live server)."""

from __future__ import annotations

from airflow_provider_cdc.testing.types_doc import render
from tests.conftest import ROOT


def test_types_doc_is_current(db15):
    committed = (ROOT / "docs" / "types.md").read_text(encoding="utf-8")
    assert render(db15.info) == committed, "docs/types.md is stale: run .venv/bin/python scripts/gen_types_doc.py"
