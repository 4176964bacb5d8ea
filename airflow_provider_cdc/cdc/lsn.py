"""PostgreSQL's LSN, at its old import path (it lives in ``cdc/sources/postgres/lsn.py``)."""

from airflow_provider_cdc.cdc.sources.postgres.lsn import MAX_LSN, Lsn, lsn_or_none

__all__ = ["MAX_LSN", "Lsn", "lsn_or_none"]
