"""The PostgreSQL source. Constants a capture validates when a DAG file is parsed live here, where
importing them loads nothing heavy (the source's modules need pyarrow, numpy and psycopg)."""

PUBLICATION_MODES = ("filtered", "all_tables", "disabled")
