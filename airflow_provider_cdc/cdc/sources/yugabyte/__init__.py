"""YugabyteDB (YSQL) logical replication source: yboutput over the walsender, PostgreSQL-shaped.

Constants a capture validates when a DAG file is parsed live here, where importing them loads
nothing heavy (the source's modules need pyarrow, numpy and psycopg)."""

LSN_TYPES = ("HYBRID_TIME", "SEQUENCE")
#: The output plugin of every slot this source makes (pgoutput cannot stream REPLICA IDENTITY CHANGE).
PLUGIN = "yboutput"
