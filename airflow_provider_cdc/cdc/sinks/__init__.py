"""Landing: where a window's events go and how a reader finds them. Storage (local, Hadoop via
Spark, Arrow filesystems, object stores), the Parquet writer, the lake-table formats (Iceberg,
Delta), the commit log (a window is landed when its entry is), schemas merged across table
versions, and the readers of committed windows.

May import: ``basics``, ``events``.
"""
