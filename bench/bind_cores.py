"""Bound or not: each rank on its own CPUs (job config `bind_cores`, training/rank/cores.py) against ranks that
float over all of them, for ringflow and for the plain peers, at np=1 and np=2. Measured two ways:

1. In one job (bench/bind_in_job.py): ringflow's loop and the plain loop of its library in alternating
   blocks, the rank's binding switched between pairs of blocks, each block compared with its neighbours,
   so the machine's drift cancels. The figure to read on a shared machine.
2. In separate jobs, on bench/throughput.py's model, settings and job runners (one torch thread per rank,
   ringflow's Horovod/Open MPI settings for every job): ringflow's engines with `bind_cores` true and false,
   and the plain peers (bench/peer_worker.py), which bind through the same cores.py call before their
   library starts its threads. Each repeat runs every configuration bound and not bound back to back, the
   order flipped from one repeat to the next; ratios within a repeat, then their median.

At np=1 a rank's share is every usable CPU, the mask it started with: its ratios are the noise of the
method. Results are rewritten after every job, so a stopped run keeps what it measured.

    .venv/bin/python -m bench.bind_cores [--jobs 3] [--repeats 6] [--steps 1600] [--in-job-steps 1200] [--block 100]
                                         [--only NAME ...] [--skip-in-job] [--skip-separate] [--out bind_cores]
                                         [--results-dir DIR]

Results: bench/results/<out>.json and <out>.md.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from . import bind_in_job, throughput  # throughput: its job runners
from .common import BATCH, FEATURES, HIDDEN, environment, quartiles, shards, shown_environment, spread
from .results_file import add_results_arguments, write_results

# ringflow with checkpoints off (bind_in_job.SETTINGS), as the plain peers never checkpoint: binding is what
# differs. Each runner's rate (throughput's runners also give the monitor's share, not used here).
CONFIGS = {
    "ringflow horovod": lambda root, n, steps, bind: throughput.ringflow(
        root, n, steps, "horovod", settings=bind_in_job.SETTINGS | {"bind_cores": bind})[0],
    "horovod + mpi": lambda root, n, steps, bind: throughput.peer("horovod", "mpi", n, steps, bind)[0],
    "ringflow ddp": lambda root, n, steps, bind: throughput.ringflow(
        root, n, steps, "ddp", settings=bind_in_job.SETTINGS | {"bind_cores": bind})[0],
    "torch DDP + gloo": lambda root, n, steps, bind: throughput.peer("ddp", None, n, steps, bind)[0],
}
# Compared with its own library's plain peer, both bound and both not.
PEERS = {"ringflow horovod": "horovod + mpi", "ringflow ddp": "torch DDP + gloo"}
ENGINES, NPS = ("horovod", "ddp"), (1, 2)


def spread_text(values: list[float], digits: int = 3) -> str:
    return spread(values, digits) if values else "—"


def quartiles_text(values: list[float]) -> str:
    if len(values) < 2:
        return spread_text(values)
    median, lower, upper = quartiles(values)
    return f"{median:.3f} ({lower:.3f}–{upper:.3f})"


def in_job_lines(results: dict[str, dict[str, list[float]]], args) -> list[str]:
    lines = ["## In one job: bound and not bound in alternating blocks", "",
             f"Up to {args.jobs} jobs per row of {args.in_job_steps} ringflow steps, bind_cores true; after each "
             f"block of {args.block} ringflow steps and {args.block} plain-loop steps the rank's threads move between "
             "its own share and every CPU (bench/bind_in_job.py). Each ratio: a block's throughput over its "
             "neighbours' of the other binding; median of all blocks, quartiles in brackets. CPU: the process's "
             "CPU seconds per block, which other work on the machine does not lengthen.", "",
             "| engine | ringflow bound / not bound, wall | same, CPU | plain bound / not bound, wall | same, CPU "
             "| ringflow / plain, bound | ringflow / plain, not bound | block pairs |",
             "|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        lines.append(f"| {key} | {quartiles_text(r['ringflow_bound_vs_not'])} | "
                     f"{quartiles_text(r['ringflow_bound_vs_not_cpu'])} | "
                     f"{quartiles_text(r['plain_bound_vs_not'])} | {quartiles_text(r['plain_bound_vs_not_cpu'])} | "
                     f"{quartiles_text(r['ringflow_vs_plain_bound'])} | "
                     f"{quartiles_text(r['ringflow_vs_plain_not_bound'])} | "
                     f"{len(r['ringflow_bound_vs_not'])} |")
    return lines


def separate_lines(rates: dict, args) -> tuple[list[dict], dict[str, list[float]], list[str]]:
    def ratios(a: list[float], b: list[float]) -> list[float]:
        return [x / y for x, y in zip(a, b)]

    rows = []
    for name, by_np in rates.items():
        for np_, r in by_np.items():
            if r[True] and r[False]:
                rows.append({"config": name, "np": np_, "bound_runs": r[True], "not_bound_runs": r[False],
                             "bound_vs_not": ratios(r[True], r[False]),
                             "ratio_of_medians": statistics.median(r[True]) / statistics.median(r[False])})
    peers = {f"{ours} / {theirs} np={np_} {'bound' if bind else 'not bound'}":
             ratios(rates[ours][np_][bind], rates[theirs][np_][bind])
             for ours, theirs in PEERS.items() if ours in rates and theirs in rates
             for np_ in NPS for bind in (True, False) if rates[theirs][np_][bind]}
    lines = ["## In separate jobs", "",
             f"Every job runs with {json.dumps(shown_environment())}, {args.steps} steps after warm-up; "
             f"up to {args.repeats} repeats, bound and not bound back to back in each, the order alternating.", "",
             "| configuration | np | bound samples/s | not bound samples/s | bound / not bound, per repeat | "
             "ratio of the medians |", "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['config']} | {row['np']} | {spread_text(row['bound_runs'], 0)} | "
                     f"{spread_text(row['not_bound_runs'], 0)} | {spread_text(row['bound_vs_not'])} | "
                     f"{row['ratio_of_medians']:.3f} |")
    if peers:
        lines += ["", "ringflow / its plain peer, per repeat then median (min–max): " +
                  "; ".join(f"{k}: {spread_text(v)}" for k, v in peers.items())]
    return rows, peers, lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=3, help="in-one-job comparisons per engine and np")
    p.add_argument("--in-job-steps", type=int, default=1200)
    p.add_argument("--block", type=int, default=100,
                   help="ringflow steps per block: a multiple of gc_every_steps, so every block holds as many of "
                        "the loop's scheduled collections (with one every other block, the kinds would differ by it)")
    p.add_argument("--repeats", type=int, default=6, help="repeats of the separate jobs")
    p.add_argument("--steps", type=int, default=1600, help="steps of each separate job")
    p.add_argument("--only", nargs="+", choices=list(CONFIGS), help="separate-job configurations (default: all)")
    p.add_argument("--skip-in-job", action="store_true")
    p.add_argument("--skip-separate", action="store_true")
    add_results_arguments(p, "bind_cores")
    args = p.parse_args()
    from ringflow.training.formats.config import JobConfig

    gc_every = JobConfig.from_dict({"manifest_uri": "/m/manifest.json", "run_uri": "/r"}).gc_every_steps
    if args.block % gc_every:
        p.error(f"--block {args.block}: use a multiple of gc_every_steps ({gc_every})")
    from ringflow.training.rank.cores import decide_cpu_share
    from ringflow.training.rank.cpu_limits import cpu_quota_cores, host_cpu_count, usable_cpus

    root = Path(tempfile.mkdtemp(prefix="ringflow-bench-bind-"))
    for np_ in NPS:
        shards(root, np_)
    usable, quota = usable_cpus(), cpu_quota_cores()
    shares = {n: [decide_cpu_share(usable, quota, host_cpu_count(), r, n, True).describe(r, n) for r in range(n)]
              for n in NPS}
    loads: list[float] = []  # the host's 1-minute load average after each job: how much other work there was
    in_job: dict[str, dict[str, list[float]]] = {}
    configs = {name: run for name, run in CONFIGS.items() if not args.only or name in args.only}
    rates = {name: {n: {True: [], False: []} for n in NPS} for name in configs}

    def save(final: bool = False) -> None:
        lines = [f"Model: MLP {FEATURES}->{HIDDEN}->10, {BATCH} rows per worker per "
                 f"step, one torch thread per rank. This host: CPUs {usable}, CPU quota "
                 f"{quota if quota is not None else 'none'}, shared with other work: the 1-minute load average after "
                 f"each job was {spread_text(loads, 1)} (median, min–max) on {len(usable)} CPUs. Bound, each rank's "
                 f"share:", ""]
        lines += [f"- np={n}: " + "; ".join(s) for n, s in shares.items()] + [""]
        if in_job:
            lines += in_job_lines(in_job, args) + [""]
        rows, peers, more = separate_lines(rates, args)
        if rows:
            lines += more
        summary = {"cpus": list(usable), "cpu_quota_cores": quota, "cores": os.cpu_count(),
                   "shares": shares, "load_averages": loads, "environment": shown_environment(),
                   "in_job": {"steps": args.in_job_steps, "block": args.block, "ratios": in_job,
                              "medians": {k: {name: statistics.median(v) for name, v in r.items() if v}
                                          for k, r in in_job.items()}},
                   "separate": {"steps": args.steps, "rows": rows, "ringflow_vs_peer": peers}}
        write_results(args, summary, lines, echo=final)

    if not args.skip_in_job:
        for job in range(args.jobs):  # interleaved, so drifting machine load hits every row alike
            for engine in ENGINES:
                for np_ in NPS:
                    blocks = bind_in_job.run_job(root, engine, np_, args.in_job_steps, args.block,
                                                 environment())
                    loads.append(os.getloadavg()[0])
                    for name, values in bind_in_job.job_ratios(blocks).items():
                        in_job.setdefault(f"{engine} np={np_}", {}).setdefault(name, []).extend(values)
                    print(f"in one job {engine} np={np_} job {job}: " + json.dumps(
                        {k: round(statistics.median(v), 3) for k, v in bind_in_job.job_ratios(blocks).items() if v}),
                        flush=True)
                    save()
    if not args.skip_separate:
        for repeat in range(args.repeats):
            order = (True, False) if repeat % 2 == 0 else (False, True)
            for name, run in configs.items():
                for np_ in NPS:
                    for bind in order:
                        rates[name][np_][bind].append(run(root, np_, args.steps, bind))
                        loads.append(os.getloadavg()[0])
                        print(f"repeat {repeat} {name} np={np_} {'bound' if bind else 'not bound'}: "
                              f"{rates[name][np_][bind][-1]:.0f} samples/s, load {loads[-1]:.1f}", flush=True)
                    if len(rates[name][np_][True]) == len(rates[name][np_][False]):
                        save()
    save(final=True)


if __name__ == "__main__":
    main()
