"""Capture configurations, one module per source, on a shared base (:mod:`.base`) and run-session
interface (:mod:`.source_run`). DAGs import the classes from :mod:`airflow_provider_cdc.capture`."""
