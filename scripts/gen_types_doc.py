"""Regenerate docs/types.md against a throwaway PostgreSQL 15 (see airflow_provider_cdc/testing/types_doc.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir
    from airflow_provider_cdc.testing.types_doc import render

    work = scratch_dir("cdc-types-doc-")
    cluster = PostgresCluster(available_flavours()["pg15"], work).start()
    try:
        cluster.create_database("types_doc")
        info = PgConnectionInfo(
            cluster.host,
            cluster.port,
            "types_doc",
            cluster.superuser,
            password=cluster.password,
            options=(("sslmode", "disable"),),  # a throwaway loopback cluster without TLS
        )
        (ROOT / "docs" / "types.md").write_text(render(info), encoding="utf-8")
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("wrote docs/types.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
