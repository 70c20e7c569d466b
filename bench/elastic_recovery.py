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

At a user's size (--real-size): the workload of tests/real_size_workload.py, as bench/real_sizes.py runs it (1 GB
of shards in S3 (moto) behind a throttling proxy of 8 MB/s shared by both ranks, a 25 M-parameter model whose
checkpoint with Adam's state is ~300 MB), np=2, rank 1 SIGKILLed at step REAL_KILL_AT: after the checkpoint of step
50 (the default interval) is published (the one due at step 100 waits for it), while the one of step 100 uploads (at
this size an upload takes about as long as a checkpoint interval: one is almost always in flight), so the retry
resumes from step 50's and reads its 300 MB back through the link, while elastic's survivor goes back to its
in-memory commit of step 100 (the default interval too), its first data loading beside that upload. Measured as above,
plus the retry's split: kill -> the next try's `start` record (new processes, the checkpoint read back) and
`start` -> its first step (the first data window through the link). A run takes 3-4 min to reach the kill (start-up
and steps are bound by the link), so this case runs ONE repeat of each job by default, elastic first, and the
bench stops each job once its measured step is in the store: what comes after it measures nothing here (the
slow test tests/training/test_real_sizes.py runs this workload to its end). ~10 min in all:

    .venv/bin/python -m bench.elastic_recovery --real-size --out elastic_recovery_real_size

With --engine ddp the same case under DDP: elastic is torchrun's restart of every worker (2 -> 2) from the copy
of the state the host keeps in memory (rank/ddp_elastic.py), its commits every commit_every_steps too:

    .venv/bin/python -m bench.elastic_recovery --real-size --engine ddp --out elastic_recovery_real_size-ddp
"""
from __future__ import annotations

if not __package__:
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from .common import (BATCH, Moto, environment, machine, read_health, read_result, shards, shown_environment, spread,
                     tests_module)
from .results_file import add_results_arguments, write_results

KILL_AT = 40
# The real-size case's kill: 10 steps after the checkpoint of step 100 began its upload, which waited for step 50's
# (an upload takes ~90-120 s through the link while the data streams, bench/results/real_sizes.md; a step ~1.5 s).
REAL_KILL_AT = 110
# How long a real-size job may take to reach its measured step (start-up ~75 s, then ~3 s a step).
REAL_TIMEOUT_SECONDS = 900
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


def commit_share(result, np_: int) -> float:
    """The commits' share of the training time, measured in the job itself (result.json: rank 0's training
    thread's time in commits) against the steps between two commits at the job's own samples/s."""
    from ringflow.training.formats.config import ElasticConfig

    step_seconds = np_ * BATCH / result.samples_per_sec_after_warmup
    return (result.elastic_commit_seconds / result.elastic_commits) / (ElasticConfig().commit_every_steps * step_seconds)


def commit_cost(root: Path, manifest: str, epochs: int, n: int) -> tuple[float, float, float]:
    from ringflow.training.formats.config import ElasticConfig
    from ringflow.training.store import LocalFolderStore

    rates, share = {}, None
    every_default = ElasticConfig().commit_every_steps
    for every in ([every_default, 10**9] if n % 2 == 0 else [10**9, every_default]):
        config, _ = train(root, f"commits-{every}-{n}", manifest, 2, epochs, elastic={"commit_every_steps": every},
                          kill_rank=None)
        result = read_result(LocalFolderStore(config["run_uri"]))
        rates[every] = result.samples_per_sec_after_warmup
        if every == every_default:
            share = commit_share(result, 2)
    return rates[every_default], rates[10**9], share


def side_by_side(repeats: int, recover: Callable[[int], dict], retry: Callable[[int], dict], label: str,
                 recovered_as: str) -> tuple[list[dict], list[dict]]:
    """`repeats` of (recovery inside the job, a retry), interleaved, which goes first alternating: each
    measure gets the repeat's number."""
    recovered, retried = [], []
    for n in range(repeats):
        pair = ((retry, retried), (recover, recovered))
        for measure, into in (pair if n % 2 else pair[::-1]):
            into.append(measure(n))
        print(f"{label} repeat {n + 1}: {recovered_as} {recovered[-1]}, retry {retried[-1]}", flush=True)
    return recovered, retried


def in_memory_cost(repeats: int, cost: Callable[[int], tuple[float, float, float]], what: str) -> dict:
    """`repeats` of `cost(n)` -> (samples/s with the in-memory copies, without, their share of the job's training
    time), as the results' summary holds them."""
    from ringflow.training.formats.config import ElasticConfig

    with_copies, without, shares = [], [], []
    for n in range(repeats):
        a, b, share = cost(n)
        with_copies.append(a)
        without.append(b)
        shares.append(share)
        print(f"{what} repeat {n + 1}: {a:,.0f} vs {b:,.0f} samples/s; in the job, {share:.2%} of the time", flush=True)
    return {"every_steps": ElasticConfig().commit_every_steps, "with": with_copies, "without": without,
            "ratio": [a / b for a, b in zip(with_copies, without)], "share_in_job": shares}


# -- at a user's size (--real-size) -----------------------------------------------------------------------------------

def real_job(workload, moto: Moto, endpoint: str, run_uri: str, manifest_uri: str, folder: Path, *, engine: str,
             elastic: bool, retries: int, until: Callable[[list[dict], str], bool]) -> tuple[list[dict], str]:
    """`ringflow train --np 2 --controller gloo --retries N` of the real-size job (the workload's config and
    environment, the store reached through the link at `endpoint`), rank 1 SIGKILLed at REAL_KILL_AT, health every
    step; stopped (SIGTERM: the launcher stops its ranks) once `until(records, output)` holds, polled from the
    store itself as a watcher beside it would. The run folder's health records then, and the job's output."""
    from ringflow.training.store import open_store

    overrides = {"engine": engine, "health": {"every_steps": 1},
                 "faults": [{"kind": "crash", "rank": 1, "step": REAL_KILL_AT}]} | ({"elastic": {}} if elastic else {})
    job = workload.RealSizeJob(endpoint, moto, run_uri, manifest_uri, **overrides)
    name = run_uri.rsplit("/", 1)[-1]
    path, log = folder / f"{name}.json", folder / f"{name}.log"
    path.write_text(json.dumps(job.config))
    command = [sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np", str(workload.PARTITIONS),
               "--controller", "gloo", "--retries", str(retries)]  # Gloo in both: only `elastic` differs
    run = open_store(run_uri, moto.settings())
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True, env=job.env())
    deadline = time.monotonic() + REAL_TIMEOUT_SECONDS
    try:
        while True:
            time.sleep(2)
            output, records = log.read_text(), read_health(run)
            if until(records, output):
                return records, output
            if proc.poll() is not None:
                raise SystemExit(f"{name} exited {proc.returncode} before its measured step:\n{output[-4000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: no measured step within {REAL_TIMEOUT_SECONDS} s:\n{output[-4000:]}")
    finally:
        if proc.poll() is None:  # measured: the rest of the job measures nothing here
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(180)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def published_before(records: list[dict], died: float) -> list[dict]:
    """The checkpoints whose upload had ended (published) before the kill: step, MB, upload seconds."""
    return [{"step": r["step"], "mb": round(r["bytes"] / 1e6), "upload_s": round(r["write_seconds"], 1)}
            for r in records if r["type"] == "checkpoint" and r["time"] < died]


def real_elastic(workload, moto: Moto, endpoint: str, bucket: str, manifest_uri: str, folder: Path, n: int,
                 engine: str) -> dict:
    records, out = real_job(workload, moto, endpoint, f"s3://{bucket}/runs/elastic-{n}", manifest_uri, folder,
                            engine=engine, elastic=True, retries=0,
                            until=lambda records, _: any(r["type"] == "membership" for r in records))
    _, died = killed_at(out)
    (change,) = [r for r in records if r["type"] == "membership"]
    return {"seconds": change["resumed_at"] - died, "steps_redone": change["steps_redone"],
            "went_back_to": f"the commit of step {change['commit_step']}",
            "noticed_s": change["failed_at"] - died,
            "failed_to_next_step_s": change["resumed_at"] - change["failed_at"],
            "published_before_kill": published_before(records, died)}


def real_retry(workload, moto: Moto, endpoint: str, bucket: str, manifest_uri: str, folder: Path, n: int,
               engine: str) -> dict:
    def next_try_stepped(records: list[dict], out: str) -> bool:
        starts = [r for r in records if r["type"] == "start"]
        return KILL_LINE.search(out) is not None and len(starts) > 1 and any(
            r["type"] == "step" and r.get("attempt") == starts[-1]["attempt"] for r in records)

    records, out = real_job(workload, moto, endpoint, f"s3://{bucket}/runs/retry-{n}", manifest_uri, folder,
                            engine=engine, elastic=False, retries=1, until=next_try_stepped)
    step, died = killed_at(out)
    start = [r for r in records if r["type"] == "start"][-1]
    if start.get("resumed_from") is None:
        raise SystemExit(f"the next try resumed from no checkpoint: none was published before the kill at step "
                         f"{step}; raise REAL_KILL_AT (published: {published_before(records, died)})")
    first = min((r for r in records if r["type"] == "step" and r.get("attempt") == start["attempt"]),
                key=lambda r: r["time"])
    return {"seconds": first["time"] - died, "steps_redone": step - 1 - start["step"],
            "went_back_to": f"checkpoint {start['resumed_from']}", "to_start_s": start["time"] - died,
            "start_to_step_s": first["time"] - start["time"], "published_before_kill": published_before(records, died)}


def real_size(args: argparse.Namespace) -> None:
    """The recovery at a user's size (the module's docstring): the workload's shards in moto, the link in front of
    it, `args.repeats` pairs of jobs (elastic first in even repeats), the results file."""
    from ringflow.training.formats.config import CheckpointConfig, ElasticConfig
    from ringflow.training.store import S3Store

    workload = tests_module("real_size_workload")
    fault_proxy = tests_module("s3_fault_proxy")
    folder = Path(tempfile.mkdtemp(prefix="ringflow-bench-elastic-real-"))
    elastic, retry = [], []
    with Moto(folder / "moto.log") as moto:
        bucket = moto.new_bucket("rf-bench-elastic-real")
        began = time.monotonic()
        manifest_uri = workload.write_wide_shards(S3Store.from_settings(bucket, "shards", moto.settings()))
        shard_seconds = time.monotonic() - began
        print(f"shards written in {shard_seconds:.0f} s", flush=True)
        with fault_proxy.FaultProxy(moto.endpoint) as proxy:
            proxy.link(bytes_per_second=workload.LINK_BYTES_PER_SECOND, latency=workload.LINK_LATENCY)
            for n in range(args.repeats):
                pair = ((real_elastic, elastic), (real_retry, retry))
                for measure, into in (pair if n % 2 == 0 else pair[::-1]):
                    into.append(measure(workload, moto, proxy.endpoint, bucket, manifest_uri, folder, n, args.engine))
                    print(f"{measure.__name__} repeat {n + 1}: {into[-1]}", flush=True)
    e, t = [r["seconds"] for r in elastic], [r["seconds"] for r in retry]
    ratio = statistics.median(t) / statistics.median(e)
    summary = {"machine": machine(), "engine": args.engine, "kill_at_step": REAL_KILL_AT, "killed_rank": 1,
               "workers": workload.PARTITIONS,
               "parameters": workload.parameters(), "link_bytes_per_second": workload.LINK_BYTES_PER_SECOND,
               "link_latency_s": workload.LINK_LATENCY, "rows_per_partition": workload.ROWS_PER_PARTITION,
               "batch": workload.BATCH, "checkpoint_every_steps": CheckpointConfig().cadence_steps,
               "elastic_defaults": vars(ElasticConfig()), "shard_seconds": shard_seconds, "repeats": args.repeats,
               "elastic": elastic, "retry": retry, "retry_over_elastic": ratio}
    write_results(args, summary, real_size_lines(summary))


RESTART_WORDS = (": torchrun restarts every worker from the copy of the state the host keeps in memory, their first "
                 "windows read from the row groups the host kept (rank/host_ranges.py)")


def real_size_lines(summary: dict) -> list[str]:
    """The real-size case's results file."""
    from ringflow.training.formats.config import CheckpointConfig, ElasticConfig

    workload = tests_module("real_size_workload")
    elastic, retry, repeats = summary["elastic"], summary["retry"], summary["repeats"]
    ddp = summary.get("engine") == "ddp"
    whose = "restarted workers'" if ddp else "survivor's"
    workers = summary["workers"]
    e, t = [r["seconds"] for r in elastic], [r["seconds"] for r in retry]
    published = sorted({c["step"] for r in elastic + retry for c in r["published_before_kill"]})
    # The newest checkpoint due by the kill (every checkpoint interval is over the 30 s floor here): not published
    # then, it was uploading.
    due = REAL_KILL_AT // CheckpointConfig().cadence_steps * CheckpointConfig().cadence_steps
    uploading = f", while the one of step {due} uploaded" if due and due not in published else ""
    return [f"# What a worker's death costs at a user's size: recovery inside the job (elastic) against a retry "
            f"({repeats} run{'s' if repeats > 1 else ''} of each, median (min-max))", "",
            f"The workload of tests/real_size_workload.py, as bench/real_sizes.py runs it: a "
            f"{workload.parameters() / 1e6:.1f} M-parameter MLP (checkpoints of ~300 MB with Adam's state), 2 ranks "
            f"({'DDP' if ddp else 'Horovod'}, Gloo) on 2 shared cores, {workload.PARTITIONS} partitions of "
            f"{workload.ROWS_PER_PARTITION} "
            f"rows (~1 GB) in S3 (moto) behind a link of {workload.LINK_BYTES_PER_SECOND / 1e6:g} MB/s shared by both "
            f"ranks with {workload.LINK_LATENCY * 1000:g} ms a request; checkpoints every "
            f"{CheckpointConfig().cadence_steps} steps and elastic commits every "
            f"{ElasticConfig().commit_every_steps} (the defaults), health every step. Rank 1 SIGKILLed at "
            f"step {REAL_KILL_AT}, after the checkpoint of step(s) {', '.join(map(str, published)) or 'none'} had "
            f"been published{uploading}. Seconds from the kill to the end of the "
            f"{whose} first step (elastic, defaults"
            f"{RESTART_WORDS if ddp else ''}) or "
            "of the next try's first step "
            "(`ringflow train --retries 1`, which resumes from that checkpoint, read back through the link; a shell "
            "retry starts at once, an Airflow task's waits its retry_delay, 30 s by default, on top). "
            f"{'One run' if repeats == 1 else f'{repeats} interleaved runs'} of each: a run takes minutes to reach "
            "the kill (start-up and steps are bound by the link); the bench stops each job once its measured step "
            f"is in the store. Writing the shards took {summary['shard_seconds']:.0f} s.", "",
            "| workers | killed | elastic: to the next step | steps redone | retry: to the next step | steps redone | "
            "retry / elastic |", "|---|---|---|---|---|---|---|",
            f"| {workers} -> {f'{workers} (restarted)' if ddp else workers - 1} | rank 1 | {spread(e)} s | "
            f"{spread([r['steps_redone'] for r in elastic], 0)} | {spread(t)} s | "
            f"{spread([r['steps_redone'] for r in retry], 0)} | **{summary['retry_over_elastic']:.1f}x** |", "",
            f"Elastic: {'the last step before the death ended' if ddp else 'the survivor noticed the death'} "
            f"{spread([r['noticed_s'] for r in elastic])} s {'from' if ddp else 'after'} the kill "
            f"and {'the restarted workers' if ddp else 'it'} ended {'their' if ddp else 'its'} first step "
            f"{spread([r['failed_to_next_step_s'] for r in elastic])} s after that, from "
            f"{elastic[0]['went_back_to']}. Retry: the next try's `start` record (new processes, the checkpoint read "
            f"back) {spread([r['to_start_s'] for r in retry])} s after the kill, its first step (the first data "
            f"through the link) {spread([r['start_to_step_s'] for r in retry])} s after that, from "
            f"{retry[0]['went_back_to']}.",
            f"Machine: {summary['machine']}"]


def main() -> None:
    from ringflow.training.formats.config import ElasticConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --real-size)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--commit-epochs", type=int, default=30,
                        help="epochs of the commit-cost jobs (long enough that a few commits are not lost in start-up noise)")
    parser.add_argument("--commits-only", action="store_true", help="only the commit cost (e.g. with --out elastic_commits)")
    parser.add_argument("--real-size", action="store_true",
                        help="only the recovery at a user's size (tests/real_size_workload.py), e.g. with "
                             "--out elastic_recovery_real_size")
    parser.add_argument("--engine", choices=("horovod", "ddp"), default="horovod",
                        help="the real-size case's engine (the small cases are Horovod's)")
    add_results_arguments(parser, "elastic_recovery")
    args = parser.parse_args()
    if args.real_size:
        args.repeats = 1 if args.repeats is None else args.repeats
        return real_size(args)
    args.repeats = 3 if args.repeats is None else args.repeats
    cases = [] if args.commits_only else [(2, 1), (3, 1), (3, 0)]  # (workers, the rank killed)
    summary = {"machine": machine(), "environment": shown_environment(), "kill_at_step": KILL_AT,
               "epochs": args.epochs, "defaults": vars(ElasticConfig()), "cases": {}}
    rows = []
    with tempfile.TemporaryDirectory(prefix="ringflow-bench-elastic-") as tmp:
        root = Path(tmp)
        manifests = {np_: shards(root, np_) for np_ in {2} | {np_ for np_, _ in cases}}
        for np_, kill_rank in cases:
            elastic, retry = side_by_side(
                args.repeats, lambda n: elastic_recovery(root, manifests[np_], np_, args.epochs, n, kill_rank),
                lambda n: retry_recovery(root, manifests[np_], np_, args.epochs, n, kill_rank),
                f"np={np_} kill rank {kill_rank}", "elastic")
            e = [r["seconds"] for r in elastic]
            t = [r["seconds"] for r in retry]
            ratio = statistics.median(t) / statistics.median(e)
            summary["cases"][f"np{np_}-rank{kill_rank}"] = {"elastic": elastic, "retry": retry, "retry_over_elastic": ratio}
            rows.append(f"| {np_} -> {np_ - 1} | rank {kill_rank}{' (the writer)' if kill_rank == 0 else ''} | "
                        f"{spread(e)} s | {spread([r['steps_redone'] for r in elastic], 0)} | {spread(t)} s | "
                        f"{spread([r['steps_redone'] for r in retry], 0)} | **{ratio:.1f}x** |")
        summary["commits"] = in_memory_cost(args.repeats, lambda n: commit_cost(root, manifests[2], args.commit_epochs, n),
                                            "commits")
        commits = summary["commits"]
        with_commits, without, ratios, shares = (commits[k] for k in ("with", "without", "ratio", "share_in_job"))
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
             f"**{statistics.median(ratios):.3f}x** ({min(ratios):.3f}-{max(ratios):.3f}) per repeat: jobs run one "
             "after the other, so this ratio carries the host's noise between two runs. Measured inside the job "
             "instead (result.json's elastic_commit_seconds / elastic_commits, rank 0's training thread, against the "
             "steps between two commits at the job's own samples/s): the commits take "
             f"**{statistics.median(shares):.2%}** ({min(shares):.2%}-{max(shares):.2%}) of the training time.", "",
             "A survivor waiting on another survivor, not on the killed worker, is told at once when that one, "
             "having noticed the death, shuts Horovod down and its Gloo connections close (docker/build-horovod.sh's "
             "gloo-finalize-process-sets patch; before it they stayed open and such a survivor waited out the peer "
             f"timeout, elastic.peer_timeout_seconds, {ElasticConfig().peer_timeout_seconds:g} s: the 3-worker rows "
             "of elastic_recovery-before_gloo_finalize.md). The peer timeout is still what finds a worker that "
             "stops answering without closing its connections (a frozen process, a host cut off); the rendezvous "
             f"keeps rendezvous_timeout_seconds, {ElasticConfig().rendezvous_timeout_seconds:g} s.",
             f"Machine: {summary['machine']}"]
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
