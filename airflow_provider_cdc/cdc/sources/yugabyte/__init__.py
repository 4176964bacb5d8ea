"""YugabyteDB (YSQL) logical replication source: yboutput over the walsender, PostgreSQL-shaped."""
