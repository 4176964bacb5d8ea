"""The engine: captures a source's changes in bounded windows and lands Debezium-compatible events.

Imports no Airflow (the Airflow side, one level up, builds a job spec and runs it here). Grouped
by stage; a stage imports only the stages listed before it, and none imports a source:

- ``basics``: the vocabulary every stage shares (errors, names, tables, positions, windows,
  the Spark session);
- ``events``: the Debezium event (envelope, columns kept or masked, value modes);
- ``sinks``: landing a window (storage, Parquet, Iceberg, Delta, the commit log) and reading it back;
- ``planning``: what a run does (the offset, reconciliation with the commit log, run records,
  incremental-snapshot state and signals, the job spec);
- ``reading``: the source-neutral readers (snapshot partitions, incremental chunks, query-based
  extraction, the frame of a window's job);
- ``state``: the current state of each table, folded from the landed events;
- ``sources``: one folder per database, built on the stages above (``docs/architecture.md``);
- ``jobs``: a window's job by connector name, the one module that loads a source (by name).
"""
