"""What Airflow and the pipeline's other steps add around the training job, on the embedded default:
ringflow_retrain with its default Params (digits, 2 local Horovod workers, 5 epochs) run by `dag.test()`,
the way `make pipeline` runs it. Overhead = whole-DAG wall time minus the training job's own wall time
(from the job's launch to its exit status, as the local backend records them).

Run 1 is cold (imports of Great Expectations, torch and the DAG in this process, like `make pipeline`),
run 2 warm. Each task's own duration is reported too, and the gaps between tasks (scheduling).

    .venv/bin/python -m bench.orchestration_overhead [--runs 2] [--epochs 5] [--out NAME] [--results-dir DIR]

Results: bench/results/orchestration_overhead.json and bench/results/orchestration_overhead.md.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import REPO, machine
from .results_file import add_results_arguments, write_results

DAG_ID = "ringflow_retrain"


def setup_airflow(home: Path) -> None:
    os.environ.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        "RINGFLOW_STORE": str(home / "ringflow-data"), "RINGFLOW_LOCAL_JOBS": str(home / "jobs"),
        "GX_ANALYTICS_ENABLED": "False", "MPLBACKEND": "Agg",
    })
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True,
                   timeout=600)


def job_seconds(jobs: Path) -> dict[str, float]:
    """Each job's wall time: its pid file is written at launch, its exit_code file when it ends."""
    out = {}
    for job in sorted(jobs.iterdir()):
        if (job / "exit_code").exists() and (job / "pid").exists():
            out[job.name] = ((job / "exit_code").stat().st_mtime_ns - (job / "pid").stat().st_mtime_ns) / 1e9
    return out


def in_job_training_seconds(run_folder: Path) -> float | None:
    """From the job's first health record to its last: the training loop itself, without process start."""
    from .common import read_health
    from ringflow.training.store import LocalFolderStore

    records = read_health(LocalFolderStore(str(run_folder)))
    times = [r["time"] for r in records if isinstance(r.get("time"), (int, float))]
    return max(times) - min(times) if times else None


def one_run(dag, conf: dict, jobs: Path, store: Path) -> dict:
    from ringflow.training.core.runs import store_layout

    before = set(job_seconds(jobs)) if jobs.exists() else set()
    started = time.perf_counter()
    dr = dag.test(run_conf=conf)
    wall = time.perf_counter() - started
    if dr.state != "success":
        raise SystemExit(f"the DAG run ended {dr.state}; cannot measure overhead")
    tis = sorted(dr.get_task_instances(), key=lambda ti: ti.start_date)
    tasks = {ti.task_id.split(".", 1)[1]: round((ti.end_date - ti.start_date).total_seconds(), 2) for ti in tis}
    gaps = [round((b.start_date - a.end_date).total_seconds(), 2) for a, b in zip(tis, tis[1:])]
    new_jobs = {k: v for k, v in job_seconds(jobs).items() if k not in before}
    (job_id, job_s), = new_jobs.items()
    run_folder = Path(store_layout.run_uri(str(store), DAG_ID, dr.run_id, "digits"))
    first_task_at = (tis[0].start_date - dr.start_date).total_seconds() if dr.start_date else None
    return {"dag_wall_s": round(wall, 2), "job_wall_s": round(job_s, 2),
            "overhead_s": round(wall - job_s, 2), "overhead_share": round((wall - job_s) / wall, 3),
            "in_job_training_loop_s": round(in_job_training_seconds(run_folder) or 0, 2),
            "tasks_s": tasks, "gaps_between_tasks_s": gaps,
            "first_task_after_s": round(first_task_at, 2) if first_task_at is not None else None, "job": job_id}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--epochs", type=int, default=None, help="default: the DAG's own default")
    add_results_arguments(p, "orchestration_overhead")
    args = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ringflow-bench-orch-"))
    setup_airflow(home)
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(str(REPO / "dags")).dags[DAG_ID]
    conf = {} if args.epochs is None else {"epochs": args.epochs}
    runs = []
    try:
        for i in range(args.runs):
            result = one_run(dag, conf, home / "jobs", home / "ringflow-data")
            runs.append(result)
            print(f"run {i + 1}: {json.dumps(result)}", flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)

    epochs = args.epochs or dag.params["epochs"]
    summary = {"dag": DAG_ID, "conf": conf, "epochs": epochs, "workers": dag.params["num_workers"],
               "runs": runs, "cold": runs[0], "warm": runs[-1] if len(runs) > 1 else None,
               "machine": machine()}
    cold, warm = runs[0], runs[-1]
    line = (f"| orchestration, {DAG_ID} defaults ({epochs} epochs, 2 workers), dag.test | whole DAG "
            f"{cold['dag_wall_s']:.1f}s cold / {warm['dag_wall_s']:.1f}s warm | training job "
            f"{cold['job_wall_s']:.1f}s / {warm['job_wall_s']:.1f}s | overhead {cold['overhead_s']:.1f}s "
            f"({cold['overhead_share']:.0%}) cold / {warm['overhead_s']:.1f}s ({warm['overhead_share']:.0%}) warm |")
    write_results(args, summary, [line])


if __name__ == "__main__":
    main()
