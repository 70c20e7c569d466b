"""What a DDP worker's death costs with `elastic` (torchrun restarts every worker in the same try, and they resume
from the host's peer copy: rank/ddp_elastic.py) and without it (today's retry from the store's checkpoint), and what
the peer copies cost while nothing dies. The DDP rows beside bench/elastic_recovery.py's Horovod ones.

Recovery, per repeat, side by side on the bench's shards (bench/common.py: the MLP, 8192 rows per worker):
- restart: `ringflow train --np N` with `elastic` at its defaults and engine ddp; rank 1 SIGKILLed by a `crash`
  fault at step KILL_AT; the time from the kill (the fault's own line) to the end of the restarted workers' first
  step (the `membership` health record's resumed_at), the steps redone, and what it resumed from (the log's
  "resuming from ..." line: the peer copy or the store);
- retry: the same job without `elastic`, `ringflow train --retries 1`: the time from the kill to the end of the
  next try's first step (its first `step` health record: health.every_steps 1 in both), the steps redone. A shell
  retry starts at once; an Airflow task's retry waits its retry_delay on top (30 s by default), not counted.

Copy cost: the DDP job at np=2 with `elastic` (copies every commit_every_steps steps, the default, and the
per-step beat) against the same job without `elastic`, interleaved, samples/s after the warm-up from result.json.

    .venv/bin/python -m bench.ddp_restart_recovery [--repeats 3] [--epochs 6]
"""
from __future__ import annotations

if not __package__:
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import BATCH, environment, machine, read_health, read_result, shards, shown_environment, spread
from .elastic_recovery import commit_share, in_memory_cost, killed_at, side_by_side
from .results_file import add_results_arguments, write_results

KILL_AT = 60  # after the default copy interval (50): a restart goes back to the copy of step 50
RESUMED_LINE = re.compile(r"torchrun restarted the workers \(restart \d+\): resuming from (the peer copy of step \d+|"
                          r"the store's checkpoint of step \d+|the start)")


def train(root: Path, name: str, manifest: str, np_: int, epochs: int, *, elastic: bool, kill: bool,
          retries: int = 0) -> tuple[dict, str]:
    config = {"manifest_uri": manifest, "run_uri": str(root / name), "engine": "ddp", "epochs": epochs,
              "batch_size": BATCH, "health": {"every_steps": 1}}
    if elastic:
        config["elastic"] = {}
    if kill:
        config["faults"] = [{"kind": "crash", "rank": 1, "step": KILL_AT}]
    path = root / f"{name}.json"
    path.write_text(json.dumps(config))
    command = [sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np", str(np_),
               "--retries", str(retries)]
    proc = subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=900)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{out[-3000:]}")
    return config, out


def restart_recovery(root: Path, manifest: str, np_: int, epochs: int, n: int) -> dict:
    from ringflow.training.store import LocalFolderStore

    config, out = train(root, f"restart-{np_}-{n}", manifest, np_, epochs, elastic=True, kill=True)
    _, died = killed_at(out)
    (change,) = [r for r in read_health(LocalFolderStore(config["run_uri"])) if r["type"] == "membership"]
    resumed = RESUMED_LINE.search(out)
    return {"seconds": change["resumed_at"] - died, "steps_redone": change["steps_redone"],
            "resumed_from": resumed.group(1) if resumed else None}


def retry_recovery(root: Path, manifest: str, np_: int, epochs: int, n: int) -> dict:
    from ringflow.training.store import LocalFolderStore

    config, out = train(root, f"retry-{np_}-{n}", manifest, np_, epochs, elastic=False, kill=True, retries=1)
    step, died = killed_at(out)
    store = LocalFolderStore(config["run_uri"])
    result = read_result(store)
    first = min((r for r in read_health(store) if r["type"] == "step" and r.get("attempt") == result.attempt
                 and r["time"] > died), key=lambda r: r["time"])
    resumed = int(result.resumed_from.rpartition("-")[2]) if result.resumed_from else 0
    return {"seconds": first["time"] - died, "steps_redone": step - 1 - resumed,
            "resumed_from": result.resumed_from}


def copy_cost(root: Path, manifest: str, epochs: int, n: int) -> tuple[float, float, float]:
    """samples/s with elastic and without, and the copies' share of the training time measured in the elastic
    job itself (result.json: rank 0's training-thread time in commits, against the steps between two)."""
    from ringflow.training.store import LocalFolderStore

    rates, share = {}, None
    for elastic in ([True, False] if n % 2 == 0 else [False, True]):
        config, _ = train(root, f"copies-{elastic}-{n}", manifest, 2, epochs, elastic=elastic, kill=False)
        result = read_result(LocalFolderStore(config["run_uri"]))
        rates[elastic] = result.samples_per_sec_after_warmup
        if elastic:
            share = commit_share(result, 2)
    return rates[True], rates[False], share


def main() -> None:
    from ringflow.training.core.launcher import DDP_ELASTIC_RESTARTS
    from ringflow.training.formats.config import CheckpointConfig, ElasticConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--copy-epochs", type=int, default=30,
                        help="epochs of the copy-cost jobs (long enough that a few copies are not lost in start-up noise)")
    add_results_arguments(parser, "ddp_restart_recovery")
    args = parser.parse_args()
    summary = {"machine": machine(), "environment": shown_environment(), "kill_at_step": KILL_AT,
               "epochs": args.epochs, "defaults": vars(ElasticConfig()), "restarts": DDP_ELASTIC_RESTARTS,
               "checkpoint_every_steps": CheckpointConfig().cadence_steps, "cases": {}}
    rows = []
    with tempfile.TemporaryDirectory(prefix="ringflow-bench-ddp-restart-") as tmp:
        root = Path(tmp)
        manifests = {np_: shards(root, np_) for np_ in (2, 3)}
        for np_ in (2, 3):
            restart, retry = side_by_side(
                args.repeats, lambda n: restart_recovery(root, manifests[np_], np_, args.epochs, n),
                lambda n: retry_recovery(root, manifests[np_], np_, args.epochs, n), f"np={np_}", "restart")
            e, t = [r["seconds"] for r in restart], [r["seconds"] for r in retry]
            ratio = statistics.median(t) / statistics.median(e)
            summary["cases"][f"np{np_}-rank1"] = {"restart": restart, "retry": retry, "retry_over_restart": ratio}
            rows.append(f"| {np_} -> {np_} | rank 1 | {spread(e)} s | {spread([r['steps_redone'] for r in restart], 0)} "
                        f"| {restart[0]['resumed_from']} | {spread(t)} s | "
                        f"{spread([r['steps_redone'] for r in retry], 0)} | **{ratio:.1f}x** |")
        summary["copies"] = in_memory_cost(args.repeats, lambda n: copy_cost(root, manifests[2], args.copy_epochs, n),
                                           "copies")
        copies = summary["copies"]
        with_copies, without, ratios, shares = (copies[k] for k in ("with", "without", "ratio", "share_in_job"))
    lines = [f"# What a DDP worker's death costs: torchrun's restart from the peer copy against a retry "
             f"({args.repeats} interleaved repeats, median (min-max))", "",
             f"Rank 1 SIGKILLed at step {KILL_AT} of a DDP job (bench MLP, batch {BATCH} per worker, {args.epochs} "
             "epochs, Gloo). Seconds from the kill to the end of the restarted workers' first step (elastic at its "
             f"defaults: torchrun restarts every worker, up to {DDP_ELASTIC_RESTARTS} times, and they resume from the "
             "newest of the host's peer copy and the store's checkpoint) or of the next try's first step "
             "(`ringflow train --retries 1`: a shell retry starts at once; an Airflow task's waits its retry_delay, "
             "30 s by default, on top). Steps redone: trained after the copy or checkpoint training went back to.", "",
             "| workers | killed | restart: to the next step | steps redone | resumed from | retry: to the next step | "
             "steps redone | retry / restart |", "|---|---|---|---|---|---|---|---|", *rows, "",
             f"Peer copies at their default interval (every {ElasticConfig().commit_every_steps} steps, and the "
             f"per-step beat; np=2, {args.copy_epochs} epochs a job): {spread(with_copies, 0)} samples/s against "
             f"{spread(without, 0)} without elastic: **{statistics.median(ratios):.3f}x** "
             f"({min(ratios):.3f}-{max(ratios):.3f}) per repeat (jobs run one after the other: the ratio carries the "
             "host's noise between two runs). Measured inside the job instead (result.json's elastic_commit_seconds "
             "/ elastic_commits: rank 0's training thread, the copy into memory; the write is its own thread's), "
             f"against the steps between two copies: **{statistics.median(shares):.2%}** "
             f"({min(shares):.2%}-{max(shares):.2%}) of the training time.", "",
             "A restart starts every worker anew, each a fork of torchrun's own process with torch and the rank "
             "already imported (rank/forked_torchrun.py; a retry starts a new torchrun, which imports them again): the "
             "time to the next step is a fork, a rendezvous and the copy's load; the copy also saves the store's "
             "read of the checkpoint and the steps since it.",
             f"Machine: {summary['machine']}"]
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
