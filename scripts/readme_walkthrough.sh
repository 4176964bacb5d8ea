#!/usr/bin/env bash
# Follows the README's "Run it under your scheduler" as a new user would, on this checkout's files:
# a fresh virtualenv with `pip install '<checkout>[spark]'` (step 1, no constraints file), a fresh
# PostgreSQL 15 with the role and publication of step 2, a fresh AIRFLOW_HOME with `airflow db
# migrate` and the `postgres_cdc` connection of step 3 (and its Test connection), the example DAG
# copied with its settings block edited (step 4), `airflow standalone`, unpause (step 5); then
# waits for the scheduled run, commits changes, triggers a manual run and waits for it.
# Opt-in (about 10 minutes, needs the package index): ./scripts/readme_walkthrough.sh [WORKDIR]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
W="${1:-/tmp/cdc-readme-walkthrough}"
PORT="${WALKTHROUGH_PG_PORT:-55432}"
API_PORT="${WALKTHROUGH_API_PORT:-28080}"
PG_BIN=/usr/lib/postgresql/15/bin

stop() {
  pkill -f "$W/venv/bin/airflow" 2>/dev/null || true
  [ -f "$W/airflow.pgid" ] && kill -- -"$(cat "$W/airflow.pgid")" 2>/dev/null || true
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$W/pg/data" stop -m fast >/dev/null 2>&1 || true
}
trap stop EXIT
stop
rm -rf "$W" && mkdir -p "$W/repo"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 tar cf -) | tar xf - -C "$W/repo"

echo "step 1: pip install '<checkout>[spark]' into a fresh virtualenv"
python3 -m venv "$W/venv"
"$W/venv/bin/pip" install -q "$W/repo[spark]" > "$W/pip.log" 2>&1

echo "step 2: a PostgreSQL 15 source with wal_level=logical, the role, the publication, the grants"
mkdir -p "$W/pg" && chown postgres "$W/pg"
runuser -u postgres -- "$PG_BIN/initdb" -D "$W/pg/data" -U postgres --auth=trust > /dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$W/pg/data" -l "$W/pg/log" -o \
  "-p $PORT -c listen_addresses=127.0.0.1 -c wal_level=logical -c unix_socket_directories=$W/pg" start > /dev/null
PSQL=(psql -h 127.0.0.1 -p "$PORT" -U postgres -v ON_ERROR_STOP=1 -q)
"${PSQL[@]}" -c "CREATE DATABASE shop"
"${PSQL[@]}" -d shop <<'SQL'
CREATE TABLE public.customers (id int PRIMARY KEY, name text);
CREATE TABLE public.orders (id int PRIMARY KEY, customer_id int, amount numeric);
CREATE TABLE public.order_items (order_id int, line_no int, sku text, PRIMARY KEY (order_id, line_no));
INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 10) g;
INSERT INTO orders SELECT g, g % 10 + 1, g FROM generate_series(1, 20) g;
INSERT INTO order_items SELECT g, 1, 'sku' FROM generate_series(1, 20) g;
CREATE ROLE cdc LOGIN REPLICATION PASSWORD 'change-me';
CREATE PUBLICATION cdc_shop FOR TABLE public.customers, public.orders, public.order_items;
GRANT SELECT ON public.customers, public.orders, public.order_items TO cdc;
SQL

echo "step 3: a fresh AIRFLOW_HOME, airflow db migrate, the postgres_cdc connection"
export AIRFLOW_HOME="$W/home" PATH="$W/venv/bin:$PATH"
export AIRFLOW__API__PORT="$API_PORT" AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://localhost:$API_PORT/execution/"
cd "$W"
airflow db migrate > "$W/migrate.log" 2>&1
airflow connections add shop_db --conn-type postgres_cdc --conn-host 127.0.0.1 --conn-port "$PORT" \
  --conn-login cdc --conn-password 'change-me' --conn-schema shop > /dev/null 2>&1
AIRFLOW__CORE__TEST_CONNECTION=Enabled airflow connections test shop_db 2>/dev/null | grep -q "Connection success" \
  || { echo "Test connection failed"; exit 1; }

echo "step 4: the example DAG in the DAGs folder, settings block edited"
mkdir -p "$AIRFLOW_HOME/dags"
sed -e "s#/tmp/airflow-provider-cdc/lake#$W/lake#; s#/tmp/airflow-provider-cdc/state#$W/state#" \
  "$W/repo/dags/examples/postgres_cdc_hourly.py" > "$AIRFLOW_HOME/dags/postgres_cdc_hourly.py"

echo "airflow standalone, step 5: unpause"
setsid airflow standalone > "$W/standalone.log" 2>&1 &
echo $! > "$W/airflow.pgid"
for _ in $(seq 1 120); do airflow dags list 2>/dev/null | grep -q postgres_cdc_hourly && break; sleep 5; done
airflow dags unpause postgres_cdc_hourly > /dev/null 2>&1

wait_runs() {  # wait until every run whose id starts with $1 has finished; fail unless all succeeded
  "$W/venv/bin/python" - "$1" <<'PY'
import json, subprocess, sys, time
for _ in range(240):
    out = subprocess.run(["airflow", "dags", "list-runs", "postgres_cdc_hourly", "-o", "json"],
                         capture_output=True, text=True).stdout
    runs = [r for r in json.loads(next((l for l in out.splitlines() if l.startswith("[")), "[]"))
            if r["run_id"].startswith(sys.argv[1])]
    if runs and all(r["state"] in ("success", "failed") for r in runs):
        print("  ", [(r["run_id"], r["state"]) for r in runs])
        sys.exit(0 if all(r["state"] == "success" for r in runs) else 1)
    time.sleep(5)
sys.exit("timed out")
PY
}
echo "the scheduled run"
wait_runs scheduled__
"${PSQL[@]}" -d shop -c "UPDATE orders SET amount = amount + 1 WHERE id <= 5; INSERT INTO customers VALUES (11, 'new'); DELETE FROM order_items WHERE order_id = 20"
echo "a manual run (airflow dags trigger)"
airflow dags trigger postgres_cdc_hourly > /dev/null 2>&1
wait_runs manual__
grep -ho '"event":"state of [^"]*"' "$AIRFLOW_HOME"/logs/dag_id=postgres_cdc_hourly/run_id=manual__*/task_id=current_state/attempt=*.log
echo "the README path worked as written"
