"""What a worker's death costs, with recovery inside the job (the config's `elastic`, Horovod) and without it (today's
retry from the last checkpoint), and what the elastic commits cost while nothing dies.

Recovery, per repeat, side by side on the bench's shards (bench/common.py: the MLP, 8192 rows per worker):
- elastic: `ringflow train --np N` with `elastic` at its defaults; rank 1 (or rank 0: the run folder's writer) is
  SIGKILLed by a `crash` fault at step KILL_AT; the time from the kill (the fault's own line) to the end of the
  survivors' first step (the `membership` health record's resumed_at), and the steps redone (trained after the
  commit they went back to);
- retry: the same job without `elastic`, `ringflow train --retries 1`: the time from the kill to the end of the
  next try's first step (its first `step` health record: health.every_steps 1 in both), and the steps redone
  (trained after the checkpoint it resumed from). A shell retry starts at once; an Airflow task's retry waits
  its retry_delay on top (30 s by default), not counted here.

Commit cost: the elastic job at np=2 with commits every commit_every_steps (the default) against the same job
committing never (1e9 steps), interleaved, samples/s after the warm-up from result.json.

    .venv/bin/python -m bench.elastic_recovery [--repeats 3] [--epochs 6]
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
from .results_file import add_results_arguments, write_results

KILL_AT = 40
KILL_LINE = re.compile(r"fault: SIGKILL at step (\d+) \(unix time ([0-9.]+)\)")


def train(root: Path, name: str, manifest: str, np_: int, epochs: int, *, elastic: dict | None, kill_rank: int | None,
          retries: int = 0) -> tuple[dict, str]:
    config = {"manifest_uri": manifest, "run_uri": str(root / name), "engine": "horovod", "epochs": epochs,
              "batch_size": BATCH, "health": {"every_steps": 1}}
    if elastic is not None:
        config["elastic"] = elastic
    if kill_rank is not None:
        config["faults"] = [{"kind": "crash", "rank": kill_rank, "step": KILL_AT}]
    path = root / f"{name}.json"
    path.write_text(json.dumps(config))
    command = [sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np", str(np_),
               "--controller", "gloo", "--retries", str(retries)]
    proc = subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=900)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{out[-3000:]}")
    return config, out


def killed_at(out: str) -> tuple[int, float]:
    found = KILL_LINE.search(out)
    if found is None:
        raise SystemExit(f"no kill line in the job's output:\n{out[-3000:]}")
    return int(found.group(1)), float(found.group(2))


def elastic_recovery(root: Path, manifest: str, np_: int, epochs: int, n: int, kill_rank: int) -> dict:
    from ringflow.training.store import LocalFolderStore

    config, out = train(root, f"elastic-{np_}-{kill_rank}-{n}", manifest, np_, epochs, elastic={}, kill_rank=kill_rank)
    _, died = killed_at(out)
    (change,) = [r for r in read_health(LocalFolderStore(config["run_uri"])) if r["type"] == "membership"]
    return {"seconds": change["resumed_at"] - died, "steps_redone": change["steps_redone"]}


def retry_recovery(root: Path, manifest: str, np_: int, epochs: int, n: int, kill_rank: int) -> dict:
    from ringflow.training.store import LocalFolderStore

    config, out = train(root, f"retry-{np_}-{kill_rank}-{n}", manifest, np_, epochs, elastic=None, kill_rank=kill_rank,
                        retries=1)
    step, died = killed_at(out)
    store = LocalFolderStore(config["run_uri"])
    result = read_result(store)
    first = min((r for r in read_health(store) if r["type"] == "step" and r.get("attempt") == result.attempt
                 and r["time"] > died), key=lambda r: r["time"])
    resumed = int(result.resumed_from.rpartition("-")[2]) if result.resumed_from else 0
    return {"seconds": first["time"] - died, "steps_redone": step - 1 - resumed}


def commit_cost(root: Path, manifest: str, epochs: int, n: int) -> tuple[float, float]:
    from ringflow.training.formats.config import ElasticConfig
    from ringflow.training.store import LocalFolderStore

    rates = {}
    for every in ([ElasticConfig().commit_every_steps, 10**9] if n % 2 == 0 else [10**9, ElasticConfig().commit_every_steps]):
        config, _ = train(root, f"commits-{every}-{n}", manifest, 2, epochs, elastic={"commit_every_steps": every},
                          kill_rank=None)
        rates[every] = read_result(LocalFolderStore(config["run_uri"])).samples_per_sec_after_warmup
    return rates[ElasticConfig().commit_every_steps], rates[10**9]


def main() -> None:
    from ringflow.training.formats.config import ElasticConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--commit-epochs", type=int, default=30,
                        help="epochs of the commit-cost jobs (long enough that a few commits are not lost in start-up noise)")
    parser.add_argument("--commits-only", action="store_true", help="only the commit cost (e.g. with --out elastic_commits)")
    add_results_arguments(parser, "elastic_recovery")
    args = parser.parse_args()
    cases = [] if args.commits_only else [(2, 1), (3, 1), (3, 0)]  # (workers, the rank killed)
    summary = {"machine": machine(), "environment": shown_environment(), "kill_at_step": KILL_AT,
               "epochs": args.epochs, "defaults": vars(ElasticConfig()), "cases": {}}
    rows = []
    with tempfile.TemporaryDirectory(prefix="ringflow-bench-elastic-") as tmp:
        root = Path(tmp)
        manifests = {np_: shards(root, np_) for np_ in {2} | {np_ for np_, _ in cases}}
        for np_, kill_rank in cases:
            elastic, retry = [], []
            for n in range(args.repeats):  # interleaved, the order alternating
                pair = ((retry_recovery, retry), (elastic_recovery, elastic))
                for measure, into in (pair if n % 2 else pair[::-1]):
                    into.append(measure(root, manifests[np_], np_, args.epochs, n, kill_rank))
                print(f"np={np_} kill rank {kill_rank} repeat {n + 1}: elastic {elastic[-1]}, retry {retry[-1]}",
                      flush=True)
            e = [r["seconds"] for r in elastic]
            t = [r["seconds"] for r in retry]
            ratio = statistics.median(t) / statistics.median(e)
            summary["cases"][f"np{np_}-rank{kill_rank}"] = {"elastic": elastic, "retry": retry, "retry_over_elastic": ratio}
            rows.append(f"| {np_} -> {np_ - 1} | rank {kill_rank}{' (the writer)' if kill_rank == 0 else ''} | "
                        f"{spread(e)} s | {spread([r['steps_redone'] for r in elastic], 0)} | {spread(t)} s | "
                        f"{spread([r['steps_redone'] for r in retry], 0)} | **{ratio:.1f}x** |")
        with_commits, without = [], []
        for n in range(args.repeats):
            a, b = commit_cost(root, manifests[2], args.commit_epochs, n)
            with_commits.append(a)
            without.append(b)
            print(f"commits repeat {n + 1}: {a:,.0f} vs {b:,.0f} samples/s", flush=True)
        ratios = [a / b for a, b in zip(with_commits, without)]
        summary["commits"] = {"every_steps": ElasticConfig().commit_every_steps, "with": with_commits,
                              "without": without, "ratio": ratios}
    lines = [f"# What a worker's death costs: recovery inside the job (elastic) against a retry ({args.repeats} "
             "interleaved repeats, median (min-max))", "",
             f"A rank SIGKILLed at step {KILL_AT} of a Horovod job (bench MLP, batch {BATCH} per worker, "
             f"{args.epochs} epochs, Gloo). Seconds from the kill to the end of the survivors' first step (elastic, "
             "defaults) or of the next try's first step (`ringflow train --retries 1`: a shell retry starts at once; an "
             "Airflow task's waits its retry_delay, 30 s by default, on top). Steps redone: trained after the commit "
             "(elastic) or the checkpoint (retry) that training went back to.", "",
             "| workers | killed | elastic: to the next step | steps redone | retry: to the next step | steps redone | "
             "retry / elastic |", "|---|---|---|---|---|---|---|", *rows, "",
             f"Commits at their default interval (every {ElasticConfig().commit_every_steps} steps, np=2, "
             f"{args.commit_epochs} epochs a job): "
             f"{spread(with_commits, 0)} samples/s against {spread(without, 0)} without commits: "
             f"**{statistics.median(ratios):.3f}x** ({min(ratios):.3f}-{max(ratios):.3f}) per repeat.", "",
             "Where a killed worker was not the peer the others were waiting on, they wait out the peer timeout "
             f"(elastic.peer_timeout_seconds, {ElasticConfig().peer_timeout_seconds:.0f} s) before they notice: "
             "that is the 3-worker rows' spread.",
             f"Machine: {summary['machine']}"]
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
