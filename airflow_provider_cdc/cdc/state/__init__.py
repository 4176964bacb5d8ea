"""State: each captured table's current rows, folded from its committed events.

From the bottom up: ``versions`` (a Parquet sink's state versions and their log), the folds
(``spark_fold``, ``arrow_fold``), the lake-format state tables (``table_rows``, ``tables``,
``iceberg_table``, ``delta_table``), ``merge`` (MERGE by key, either fold), ``arrow`` (the Arrow
engine and its choice), ``apply`` (a Parquet sink's refresh), ``lake`` (an Iceberg/Delta sink's
refresh), ``jobs`` (the state job and ``read_state``).

May import: ``basics``, ``events``, ``sinks``.
"""
