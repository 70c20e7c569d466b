#!/usr/bin/env bash
# Runs the ringflow_retrain DAG once, end to end, on this machine: validate the built-in digits dataset
# with Great Expectations, shard it, train on 2 local Horovod workers, evaluate, promote. No server needed:
# `airflow dags test` runs the tasks (and the deferred train task's trigger) in this process, against a
# SQLite database in AIRFLOW_HOME.
#
#   scripts/run-pipeline.sh                     the embedded defaults
#   scripts/run-pipeline.sh '{"epochs": 10}'    a run conf (the DAG's Params: see dags/ringflow_retrain.py)
#
# Environment: AIRFLOW_HOME (default ./.airflow), RINGFLOW_STORE (default $AIRFLOW_HOME/ringflow-data),
# RINGFLOW_VENV (default ./.venv). Exits non-zero unless the DAG run succeeded and the model has a
# production pointer. An s3:// store needs the Airflow connection ringflow_s3, e.g.
#   RINGFLOW_STORE=s3://ringflow/prod AIRFLOW_CONN_RINGFLOW_S3='{"conn_type": "aws", "login": "<access key>",
#     "password": "<secret key>", "extra": {"endpoint_url": "http://127.0.0.1:9000"}}' scripts/run-pipeline.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${RINGFLOW_VENV:-$root/.venv}
airflow="$venv/bin/airflow"
python="$venv/bin/python"
conf=${1:-'{}'}
dag_id=ringflow_retrain

export AIRFLOW_HOME=${AIRFLOW_HOME:-$root/.airflow}
export AIRFLOW__CORE__DAGS_FOLDER="$root/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
# Deferred tasks come back faster than the default heartbeat check expects (an upstream race).
export AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=1
export RINGFLOW_STORE=${RINGFLOW_STORE:-$AIRFLOW_HOME/ringflow-data}
export GX_ANALYTICS_ENABLED=False
export MPLBACKEND=Agg
mkdir -p "$AIRFLOW_HOME/logs"
log="$AIRFLOW_HOME/logs/pipeline-$(date -u +%Y%m%dT%H%M%SZ).log"

echo "[pipeline] AIRFLOW_HOME=$AIRFLOW_HOME"
echo "[pipeline] store: $RINGFLOW_STORE"
echo "[pipeline] migrating the Airflow database"
if ! "$airflow" db migrate >"$log" 2>&1; then
  tail -40 "$log"
  echo "[pipeline] airflow db migrate failed; full log: $log" >&2
  exit 1
fi

echo "[pipeline] running $dag_id (conf $conf); full log: $log"
started=$(date -u +%Y-%m-%dT%H:%M:%S)
set +e
# The task log is long; show the lines that say what each step did.
"$airflow" dags test "$dag_id" --conf "$conf" 2>&1 | tee -a "$log" \
  | grep --line-buffered -E "validating |expectations of suite|sharding |wrote [0-9]+ partitions|did not fill|already at|launched .* job|\[ringflow\] (step=|done|resuming|health verdict)|training succeeded|health plot saved|held-out rows|production is now|not promoting|Task failed|retrying in|Invalid input for param|DagRun Finished" \
  | sed -E 's/^[0-9TZ:.-]+ +\[[a-z]+ *\] +//; s/ +\[[a-zA-Z_.]+\]( loc=[^ ]+)?.*$//;
           s/^DagRun Finished: .*run_duration=([0-9.]+), state=([a-z_]+).*/DAG run finished: \2 after \1 s/'
set -e

# The run's state, from the metadata database (the CLI's exit code does not say it).
state=$("$python" - "$dag_id" "$started" <<'PY'
import sys
from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session

dag_id, started = sys.argv[1], sys.argv[2]
with create_session() as session:
    runs = DagRun.find(dag_id=dag_id, session=session)
    runs = [r for r in runs if r.start_date and r.start_date.strftime("%Y-%m-%dT%H:%M:%S") >= started]
    print(max(runs, key=lambda r: r.start_date).state if runs else "missing")
PY
)
state=$(echo "$state" | tail -1)
if [ "$state" = "missing" ]; then
  echo "[pipeline] no DAG run was created (a conf value the Params refuse?); see $log" >&2
  exit 1
fi
if [ "$state" != "success" ]; then
  echo "[pipeline] the DAG run ended in state '$state'; see $log" >&2
  exit 1
fi

model=$("$python" -c 'import json,sys; print(json.loads(sys.argv[1]).get("model_name", "digits-mlp"))' "$conf")
# The pointer is read the way the tasks read the store: a folder as is, s3:// with the credentials of the
# Airflow connection ringflow_s3 (the same one the run used), so an S3 run is checked too.
"$python" - "$RINGFLOW_STORE" "$model" <<'PY'
import sys
from ringflow.operators.connections import open_store_for
from ringflow.training.core.registry.model_registry import ModelRegistry
from ringflow.training.core.runs import store_layout

store, model = sys.argv[1:]
pointer = ModelRegistry(open_store_for(store)).production(model)
where = store_layout.production_pointer_uri(store, model)
if pointer is None:
    print(f"[pipeline] the run succeeded but model '{model}' has no production pointer at {where}", file=sys.stderr)
    sys.exit(1)
metrics = ", ".join(f"{k}={v:.4g}" for k, v in pointer.metrics.items())
print(f"[pipeline] succeeded: model '{model}' version {pointer.version} is in production ({metrics})")
print(f"[pipeline]   pointer: {where}")
print(f"[pipeline]   files:   {where.rsplit('/', 1)[0]}/v{pointer.version}/")
print(f"[pipeline]   run:     {pointer.run_uri} (health.png, eval.json, result.json)")
PY
