"""The GPU path, checked in minutes on a machine that has one: one short job of each engine (Horovod, DDP)
with one rank per GPU, in each precision asked for, through ringflow's own Trainer. Records samples/s
after warm-up (as the job measures it, result.json), each rank's peak GPU memory
(torch.cuda.max_memory_allocated), which device each rank trained on, and whether the final checkpoint
holds CPU tensors only (so it resumes on a machine without a GPU).

    .venv/bin/python -m bench.gpu_check [--np N] [--precisions fp32 bf16 fp16] [--steps 300]   (make bench-gpu)

Six jobs by default (2 engines x 3 precisions), each ~300 steps plus its start (~10-20 s): a few minutes.
In the GPU training image (CUDA torch, Horovod with NCCL), from a checkout:
    docker run --rm --gpus all -v "$PWD":/work -w /work --user "$(id -u)" IMAGE python -m bench.gpu_check

Results: bench/results/gpu_check.json and .md. Without a GPU it says so, writes nothing and exits 0;
--cpu runs the same jobs on the CPU to check the script itself (results under --out, default gpu_check-cpu;
--results-dir DIR writes them elsewhere than bench/results/).
A Horovod without NCCL cannot all-reduce GPU tensors: its jobs are recorded as skipped, with the fix.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from .common import importable, write_random_shards
from .rank_script import rank_script_command
from .results_file import RESULTS, write_results

ENGINES = ("horovod", "ddp")
# Big enough that a GPU step is more than kernel launches: MLP 256 -> [1024, 1024] -> 10.
FEATURES, HIDDEN, CLASSES = 256, [1024, 1024], 10
ROWS_PER_RANK = 32768
JOB_TIMEOUT_S = 300


def rank_main(config_path: str, out_prefix: str) -> None:
    """One rank under torchrun/horovodrun: train, then note its device and peak memory."""
    import torch

    from ringflow.training.formats.config import load_job_config
    from ringflow.training.rank.engines import start_engine
    from ringflow.training.rank.worker import Trainer

    cfg = load_job_config(config_path)
    engine = start_engine(cfg)
    try:
        code = Trainer(cfg, engine).train()
        placement = engine.placement
        if placement.cuda:
            peak = torch.cuda.max_memory_allocated(torch.device(placement.device))
        else:  # --cpu: the process's peak resident memory (ru_maxrss is KiB on Linux)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        Path(f"{out_prefix}-{engine.rank}.json").write_text(json.dumps(
            {"rank": engine.rank, "device": placement.device, "exit_code": code, "peak_memory_bytes": peak,
             "skipped_fp16_steps": engine.precision.skipped_steps}))
    finally:
        engine.shutdown()
    raise SystemExit(code)


def shards(root: Path, np_: int, batch: int) -> str:
    return write_random_shards(root / "shards", partitions=np_, rows_per_partition=ROWS_PER_RANK, features=FEATURES,
                               classes=CLASSES, batch=batch)


def horovod_nccl() -> tuple[bool, str]:
    """Whether Horovod can all-reduce GPU tensors here, and why not."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        return False, f"Horovod is not installed ({exc}); build it with scripts/setup.sh or use the training image"
    if not hvd.nccl_built():
        return False, ("Horovod here was built without NCCL: use the GPU training image "
                       "(docker/training.Dockerfile, --build-arg GPU=1), or rebuild with "
                       "HOROVOD_GPU_OPERATIONS=NCCL docker/build-horovod.sh OUT_DIR")
    return True, ""


def run_job(root: Path, manifest: str, engine: str, precision: str, np_: int, batch: int, steps: int) -> dict:
    from ringflow.training.rank.engines import ENGINE_ENV
    from ringflow.training.core.launcher import rank_environment
    from .common import read_result
    from ringflow.training.store import LocalFolderStore
    from ringflow.training.rank.training_state import STATE_FILE
    from ringflow.training.formats.run_folder import RunFolder
    from ringflow.training.rank.worker_env import ATTEMPT_ENV

    tag = f"{engine}-{precision}"
    run = root / f"run-{tag}"
    cfg = {"manifest_uri": manifest, "run_uri": str(run), "engine": engine, "precision": precision,
           "epochs": max(1, round(steps / (ROWS_PER_RANK // batch))), "batch_size": batch,
           "model": {"hidden": HIDDEN}, "log_every_steps": 10**6, "checkpoint": {"every_steps": 10**6}}
    cfg_path = root / f"{tag}.json"
    cfg_path.write_text(json.dumps(cfg))
    out_prefix = root / f"rank-{tag}"
    # The launcher's `-m ringflow.training CONFIG` becomes this module's rank mode.
    command = rank_script_command(engine, str(cfg_path), np_, __spec__.name,
                                  ["--rank", str(cfg_path), "--rank-out", str(out_prefix)])
    env = importable(rank_environment() | {ATTEMPT_ENV: uuid.uuid4().hex, ENGINE_ENV: engine})
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=JOB_TIMEOUT_S)
    wall = time.perf_counter() - started
    ranks = sorted((json.loads(p.read_text()) for p in root.glob(f"rank-{tag}-*.json")), key=lambda r: r["rank"])
    row = {"engine": engine, "precision": precision, "np": np_, "batch_per_rank": batch, "wall_s": round(wall, 1),
           "exit_code": proc.returncode, "ranks": ranks}
    if proc.returncode != 0:
        return row | {"status": "failed", "output_tail": (proc.stdout + proc.stderr)[-3000:]}
    result = read_result(LocalFolderStore(str(run)))
    # The checkpoints run.json publishes (under the attempt's folder), as a resume would find them.
    loaded = RunFolder(LocalFolderStore(str(run))).checkpoints().latest_valid()
    import torch

    # No map_location: the devices the tensors were saved from.
    state = torch.load(io.BytesIO(loaded.files[STATE_FILE]), weights_only=True)
    tensors = [*state["model"].values(),
               *(t for s in state["optimizer"]["state"].values() for t in s.values() if isinstance(t, torch.Tensor))]
    return row | {"status": "ok", "steps": result.step, "loss": result.loss,
                  "samples_per_sec": result.samples_per_sec_after_warmup,
                  "peak_memory_mib": max(r["peak_memory_bytes"] for r in ranks) / 2**20 if ranks else None,
                  "devices": [r["device"] for r in ranks],
                  "checkpoint_on_cpu": all(t.device.type == "cpu" for t in tensors)}


def report(rows: list[dict], machine: dict, args) -> list[str]:
    lines = [f"GPU check: {machine['gpus']} x {machine['gpu_name']}, torch {machine['torch']}, "
             f"{args.np} rank(s), MLP {FEATURES}->{HIDDEN}->{CLASSES}, {args.batch} rows per rank per step, "
             f"~{args.steps} steps per job.", "",
             "| engine | precision | status | samples/s (all ranks) | peak memory per rank (MiB) | devices | "
             "checkpoint on CPU | wall s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rate = f"{r['samples_per_sec']:.0f}" if r.get("samples_per_sec") else "-"
        peak = f"{r['peak_memory_mib']:.0f}" if r.get("peak_memory_mib") is not None else "-"
        lines.append(f"| {r['engine']} | {r['precision']} | {r['status']} | {rate} | {peak} | "
                     f"{', '.join(r.get('devices', [])) or '-'} | {r.get('checkpoint_on_cpu', '-')} | "
                     f"{r.get('wall_s', '-')} |")
    for r in rows:
        if r["status"] != "ok":
            lines += ["", f"{r['engine']} {r['precision']}: {r.get('reason') or r.get('output_tail', '')[-1500:]}"]
    return lines


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, help="ranks (one per GPU); default: every GPU")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"], choices=["fp32", "bf16", "fp16"])
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--cpu", action="store_true", help="run on the CPU (checks this script, measures nothing GPU)")
    p.add_argument("--out", help="results file name (default gpu_check, or gpu_check-cpu)")
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="folder of the results files")
    p.add_argument("--rank", help=argparse.SUPPRESS)
    p.add_argument("--rank-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        rank_main(args.rank, args.rank_out)
        return 0
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the ranks see no GPU and train on the CPU
        gpus = 0
    elif gpus == 0:
        print(f"no GPU here (torch {torch.__version__}: torch.cuda.is_available() is False): nothing to check. "
              f"Run `make bench-gpu` on a machine with an NVIDIA GPU and a CUDA build of torch.")
        return 0
    args.np = args.np or max(gpus, 1)
    if gpus and args.np > gpus:
        raise SystemExit(f"--np {args.np} but this machine has {gpus} GPU(s): one rank per GPU")
    machine = {"gpus": gpus, "gpu_name": torch.cuda.get_device_name(0) if gpus else "CPU (--cpu)",
               "torch": torch.__version__, "cuda": torch.version.cuda}
    root = Path(tempfile.mkdtemp(prefix="ringflow-gpu-check-"))
    manifest = shards(root, args.np, args.batch)
    nccl, why_not = horovod_nccl() if gpus else (True, "")
    rows = []
    for engine in args.engines:
        for precision in args.precisions:
            if engine == "horovod" and not nccl:
                rows.append({"engine": engine, "precision": precision, "status": "skipped", "reason": why_not})
            elif precision == "fp16" and not gpus:
                rows.append({"engine": engine, "precision": precision, "status": "skipped",
                             "reason": "fp16 needs a GPU (ringflow refuses it on the CPU)"})
            else:
                rows.append(run_job(root, manifest, engine, precision, args.np, args.batch, args.steps))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "output_tail"}), flush=True)
    args.out = args.out or ("gpu_check-cpu" if args.cpu else "gpu_check")
    write_results(args, {"machine": machine, "jobs": rows}, report(rows, machine, args))
    return 1 if any(r["status"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
