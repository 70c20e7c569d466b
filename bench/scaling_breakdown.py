"""Where np=2's time goes on this 2-core host (issue 32): why np=2 / np=1 is not 2x for Horovod and DDP on the
bench model (MLP 128-256-256-10, batch 256 per rank: engines_crosscheck.py's job).

1. ringflow jobs (`ringflow train`, engines_crosscheck.py's data and settings, 4 epochs), np=1 and np=2 per
   engine, alternating: samples/s after warm-up (result.json) and, from the health records' measured steps
   after warm-up, each rank's step time and the part of it that was the gradient all-reduce not hidden
   behind compute (sync_time: Horovod's wait in synchronize(), DDP's comm hook clock; step_timing.py).
2. The same model's step taken apart, in one plain process per rank (no ringflow: no loader thread, no
   health monitor, rows in memory), started by horovodrun / torch.distributed.run at np=1 and np=2 with the
   environment ringflow's ranks get (one torch thread, one core each, Horovod's fusion threshold and cycle
   time): `compute`, forward + backward + Adam of the unwrapped model, no communication; `all-reduce`, the
   all-reduce alone of one gradient-sized float32 tensor (hvd.allreduce / dist.all_reduce), no compute;
   `step`, the distributed step (hvd.DistributedOptimizer / DDP); `flat step`, the step with the gradient
   summed as one flat tensor after the backward pass instead (no hooks, no overlap). Each timed between
   barriers, ms per step of the slowest rank.
3. Horovod's cycle time (`--cycle-times`): ringflow's Horovod job and the plain pieces of 2. at np=1 and
   np=2 under each cycle time (HOROVOD_CYCLE_TIME, which the background thread sleeps between its rounds of
   negotiation: the floor of every all-reduce's latency), alternating; ringflow's default
   (horovod.cycle_time_ms) was chosen by it.

np=2 can reach 2x only if a rank's step at np=2 costs what it costs at np=1. The table says how much of the
np=2 step is compute grown slower by sharing 2 cores with the other rank (and with each rank's own
background threads, which at np=1 had the second core to themselves), and how much is the all-reduce:
2 x compute(np=1) / compute(np=2) is the ceiling with an all-reduce that cost nothing.

    .venv/bin/python -m bench.scaling_breakdown [--repeats 2] [--steps 400] [--cycle-times MS ...] [--out NAME]
                                                [--results-dir DIR]

Results: bench/results/<out>.json and <out>.md, with the command (linked from docs/benchmarks.md).
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ringflow.training.formats.config import CYCLE_TIME_ENV, HorovodConfig

from .common import BATCH, FEATURES, HIDDEN, environment, machine, module_command, shown_environment, spread

BIN = Path(sys.executable).parent
ENGINES = ("horovod", "ddp")
# Measured steps of a job's health records before this step are warm-up (the first epoch's start).
WARMUP_STEP = 20
PHASES = ("compute", "all-reduce", "step")
FLAT = "flat step"


# -- the worker: one rank of the plain pieces --------------------------------------------------------------

def flat_allreduce_loop():
    """PlainLoop whose step sums the whole gradient over the ranks as one flat tensor after the backward pass
    (`reduce(tensor) -> summed`: the library's plain all-reduce), then averages it: none of DDP's bucket hooks
    or Horovod's per-tensor hooks, so its time beside the distributed step's says whether that machinery or
    the collective itself is the price."""
    import torch

    from .peer_worker import PlainLoop

    class FlatAllReduceLoop(PlainLoop):
        def __init__(self, model, optimizer, x, y, batch, reduce, size):
            super().__init__(model, optimizer, x, y, batch)
            self.reduce, self.size = reduce, size
            self.params = list(model.parameters())

        def after_backward(self) -> None:
            flat = self.reduce(torch.cat([p.grad.reshape(-1) for p in self.params])) / self.size
            offset = 0
            for p in self.params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    return FlatAllReduceLoop


def _worker(framework: str, steps: int, warmup: int) -> None:
    import torch

    from ringflow.training.formats.config import DEFAULT_BIND_CORES
    from ringflow.training.formats.tf_config import LOCAL_PLACE_ENV as DDP_LOCAL_RANK_ENV
    from ringflow.training.rank.cores import claim_cpu_share, local_rank_from_env
    from ringflow.training.rank.engines.horovod import LOCAL_RANK_ENV as HOROVOD_LOCAL_RANK_ENV
    from ringflow.training.rank.models import TabularMLP

    from .peer_worker import CLASSES, PlainLoop, data, plain_ddp, plain_horovod, LEARNING_RATE

    on_host = local_rank_from_env(os.environ, HOROVOD_LOCAL_RANK_ENV if framework == "horovod" else DDP_LOCAL_RANK_ENV)
    share = claim_cpu_share(DEFAULT_BIND_CORES, *(on_host or (0, 1)))
    if framework == "horovod":
        import horovod.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        barrier = lambda: hvd.allreduce(torch.zeros(1), name="bench.barrier")  # noqa: E731
        allreduce = lambda t: hvd.allreduce(t, name="bench.grad")  # noqa: E731
        summed = lambda t: hvd.allreduce(t, name="bench.flat", op=hvd.Sum)  # noqa: E731
        distributed = plain_horovod(hvd, rank, size, FEATURES, HIDDEN, BATCH)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        barrier = dist.barrier
        allreduce = dist.all_reduce

        def summed(t):
            dist.all_reduce(t)
            return t
        distributed = plain_ddp(rank, size, FEATURES, HIDDEN, BATCH)
    torch.set_num_threads(share.threads)
    torch.manual_seed(0)
    model = TabularMLP(FEATURES, CLASSES, tuple(HIDDEN))
    local = PlainLoop(model, torch.optim.Adam(model.parameters(), lr=LEARNING_RATE), *data(rank, 8192, FEATURES), BATCH)
    gradient = torch.zeros(sum(p.numel() for p in model.parameters()))

    def timed(run) -> float:
        run(warmup)
        barrier()
        started = time.perf_counter()
        run(steps)
        barrier()
        return (time.perf_counter() - started) / steps * 1e3

    def reduce(n: int) -> None:
        for _ in range(n):
            allreduce(gradient)

    torch.manual_seed(0)
    flat_model = TabularMLP(FEATURES, CLASSES, tuple(HIDDEN))
    flat = flat_allreduce_loop()(flat_model, torch.optim.Adam(flat_model.parameters(), lr=LEARNING_RATE * size),
                                 *data(rank, 8192, FEATURES), BATCH, summed, size)
    mine = {"compute": timed(local.run), "all-reduce": timed(reduce), "step": timed(distributed.run),
            FLAT: timed(flat.run),
            "threads": share.threads, "cpus": list(share.cpus), "gradient_floats": gradient.numel()}
    if framework == "horovod":
        every = hvd.allgather_object(mine)
    else:
        every = [None] * size
        dist.all_gather_object(every, mine)
    if rank == 0:
        print("BREAKDOWN " + json.dumps(every), flush=True)


# -- the driver --------------------------------------------------------------------------------------------

def plain(framework: str, np_: int, steps: int, env: dict[str, str]) -> list[dict]:
    """Every rank's ms per step of each phase (the worker above)."""
    worker = module_command(__spec__.name, "--worker", framework, "--steps", str(steps))
    if framework == "horovod":
        cmd = [str(BIN / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", "--mpi", *worker]
    else:
        from ringflow.training.core.launcher import free_port

        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", f"--nproc-per-node={np_}",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1",
               *worker[1:]]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    for line in out.stdout.splitlines():
        if "BREAKDOWN " in line:
            # raw_decode: mpirun may run another rank's output onto the end of the line
            return json.JSONDecoder().raw_decode(line[line.index("BREAKDOWN ") + len("BREAKDOWN "):])[0]
    raise RuntimeError(f"{cmd} printed no breakdown:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def job(root: Path, manifest: str, engine: str, np_: int, epochs: int, settings: dict | None = None) -> dict:
    """One `ringflow train` job as engines_crosscheck.py runs it: samples/s after warm-up, and the medians over
    its measured steps after warm-up of the slowest rank's step time and of the ranks' largest sync time."""
    from ringflow.training.store import LocalFolderStore

    from .common import read_health, read_result
    from .peer_worker import LEARNING_RATE

    run = root / f"run-{engine}-{np_}-{time.monotonic_ns()}"
    cfg = root / f"{run.name}.json"
    cfg.write_text(json.dumps({"manifest_uri": manifest, "run_uri": str(run), "engine": engine, "epochs": epochs,
                               "batch_size": BATCH, "learning_rate": LEARNING_RATE, "model": {"hidden": HIDDEN}}
                              | (settings or {})))
    out = subprocess.run([str(BIN / "ringflow"), "train", str(cfg), "--np", str(np_)], capture_output=True,
                         text=True, env=environment(), timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{engine} np={np_} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    store = LocalFolderStore(str(run))
    steps = [r for r in read_health(store) if r.get("type") == "step" and r["step"] >= WARMUP_STEP]
    return {"samples_per_sec": read_result(store).samples_per_sec_after_warmup,
            "step_ms": statistics.median(max(r["step_time"]) for r in steps) * 1e3,
            "sync_ms": statistics.median(max(r["sync_time"]) for r in steps) * 1e3,
            "measured_steps": len(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400, help="timed steps of each plain phase (after 20 warm-up)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs of each ringflow job")
    parser.add_argument("--cycle-times", nargs="*", default=[], metavar="MS",
                        help="Horovod cycle times (ms) to compare in the plain pieces, alternating")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    from .results_file import add_results_arguments, write_results

    add_results_arguments(parser, "scaling_breakdown")
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.steps, 20)
        return

    from .engines_crosscheck import write_learnable_shards

    root = Path(tempfile.mkdtemp(prefix="ringflow-bench-scaling-"))
    manifests = {np_: write_learnable_shards(root / f"shards{np_}", np_) for np_ in (1, 2)}
    env = environment()
    jobs = {e: {1: [], 2: []} for e in ENGINES}
    pieces = {e: {1: [], 2: []} for e in ENGINES}
    load_before, started = [round(v, 2) for v in os.getloadavg()], time.monotonic()
    for r in range(args.repeats):
        for engine in ENGINES if r % 2 == 0 else reversed(ENGINES):
            for np_ in (1, 2) if r % 2 == 0 else (2, 1):
                jobs[engine][np_].append(job(root, manifests[np_], engine, np_, args.epochs))
                pieces[engine][np_].append(plain(engine, np_, args.steps, env))
                print(engine, np_, jobs[engine][np_][-1], pieces[engine][np_][-1], flush=True)
    cycles = {ct: {1: [], 2: []} for ct in args.cycle_times}
    cycle_jobs = {ct: {1: [], 2: []} for ct in args.cycle_times}
    for r in range(args.repeats):
        for ct in args.cycle_times if r % 2 == 0 else reversed(args.cycle_times):
            for np_ in (1, 2):
                cycles[ct][np_].append(plain("horovod", np_, args.steps, env | {CYCLE_TIME_ENV: ct}))
                cycle_jobs[ct][np_].append(job(root, manifests[np_], "horovod", np_, args.epochs,
                                               {"horovod": {"cycle_time_ms": float(ct)}}))
                print("cycle", ct, np_, cycle_jobs[ct][np_][-1], cycles[ct][np_][-1], flush=True)
    load_after, minutes = [round(v, 2) for v in os.getloadavg()], (time.monotonic() - started) / 60

    def slowest(engine: str, np_: int, phase: str, runs: dict | None = None) -> list[float]:
        return [max(rank[phase] for rank in ranks) for ranks in (runs or pieces[engine])[np_]]

    def med(values: list[float]) -> float:
        return statistics.median(values)

    summary: dict = {"repeats": args.repeats, "steps": args.steps, "epochs": args.epochs, "jobs": jobs,
                     "pieces": pieces, "cycle_times": cycles, "cycle_time_jobs": cycle_jobs, "machine": machine(), "environment": shown_environment(),
                     "load_average_before": load_before, "load_average_after": load_after, "minutes": minutes}
    lines = [f"# Where np=2's time goes (MLP {FEATURES}-{'-'.join(map(str, HIDDEN))}-10, batch {BATCH} per rank, "
             f"{machine()['cpus']} shared cores)", "",
             "## ringflow jobs (engines_crosscheck.py's job)", "",
             "| engine | np | samples/s | step, ms (slowest rank) | of which exposed all-reduce, ms | "
             "np=2 / np=1 |", "|---|---|---|---|---|---|"]
    ratios = {}
    for engine in ENGINES:
        ratios[engine] = [b["samples_per_sec"] / a["samples_per_sec"] for a, b in zip(jobs[engine][1], jobs[engine][2])]
        for np_ in (1, 2):
            runs = jobs[engine][np_]
            lines.append(f"| {engine} | {np_} | {spread([j['samples_per_sec'] for j in runs], 0)} | "
                         f"{spread([j['step_ms'] for j in runs])} | {spread([j['sync_ms'] for j in runs])} | "
                         f"{spread(ratios[engine]) if np_ == 2 else ''} |")
    summary["np2_over_np1"] = ratios
    lines += ["", "## The step taken apart (plain processes, rows in memory, ms per step of the slowest rank)", "",
              "| engine | np | compute alone | all-reduce alone | distributed step | step - compute | "
              "ceiling of np=2 / np=1: 2 x step(np=1) / step(np=2) | with a free all-reduce: 2 x compute(np=1) / "
              "compute(np=2) | one flat all-reduce after backward instead, step |", "|---|---|---|---|---|---|---|---|---|"]
    ceilings, compute_ceilings = {}, {}
    for engine in ENGINES:
        ceilings[engine] = [2 * a / b for a, b in zip(slowest(engine, 1, "step"), slowest(engine, 2, "step"))]
        compute_ceilings[engine] = [2 * a / b for a, b in zip(slowest(engine, 1, "compute"),
                                                              slowest(engine, 2, "compute"))]
        for np_ in (1, 2):
            c, a, s = (slowest(engine, np_, p) for p in PHASES)
            lines.append(f"| {engine} | {np_} | {spread(c)} | {spread(a)} | {spread(s)} | "
                         f"{med(s) - med(c):.2f} | {spread(ceilings[engine]) if np_ == 2 else ''} | "
                         f"{spread(compute_ceilings[engine]) if np_ == 2 else ''} | "
                         f"{spread(slowest(engine, np_, FLAT))} |")
    summary["compute_np2_over_np1"] = compute_ceilings
    summary["plain_np2_over_np1"] = ceilings
    if cycles:
        lines += ["", "## Horovod's cycle time (ringflow's Horovod job, and the plain pieces in ms per step of the "
                  "slowest rank)", "",
                  "| HOROVOD_CYCLE_TIME, ms | job np=1 samples/s | job np=2 samples/s | job np=2 / np=1 | "
                  "all-reduce alone, np=1 | all-reduce alone, np=2 | distributed step, np=1 | distributed step, np=2 | "
                  "ceiling of np=2 / np=1 |", "|---|---|---|---|---|---|---|---|---|"]
        summary["cycle_np2_over_np1"], summary["cycle_job_np2_over_np1"] = {}, {}
        for ct, runs in cycles.items():
            step1, step2 = slowest("horovod", 1, "step", runs), slowest("horovod", 2, "step", runs)
            ratio = summary["cycle_np2_over_np1"][ct] = [2 * a / b for a, b in zip(step1, step2)]
            rate1, rate2 = ([j["samples_per_sec"] for j in cycle_jobs[ct][n]] for n in (1, 2))
            job_ratio = summary["cycle_job_np2_over_np1"][ct] = [b / a for a, b in zip(rate1, rate2)]
            default = " (ringflow's default)" if float(ct) == HorovodConfig().cycle_time_ms else ""
            lines.append(f"| {ct}{default} | {spread(rate1, 0)} | {spread(rate2, 0)} | {spread(job_ratio)} | "
                         f"{spread(slowest('horovod', 1, 'all-reduce', runs))} | "
                         f"{spread(slowest('horovod', 2, 'all-reduce', runs))} | {spread(step1)} | {spread(step2)} | "
                         f"{spread(ratio)} |")
    gradient = pieces[ENGINES[0]][1][0][0]["gradient_floats"]
    lines += ["", f"Medians (min–max) of {args.repeats} repeats, engines and worker counts alternating; "
              f"{args.steps} timed steps per phase after 20 warm-up; the gradient: {gradient:,} float32 "
              f"({gradient * 4 / 2**20:.2f} MiB), one fused buffer / one DDP bucket at the defaults. Every process "
              f"runs with {json.dumps(shown_environment())}. Host load average {load_before} before, {load_after} "
              f"after; {minutes:.1f} minutes in all."]
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
