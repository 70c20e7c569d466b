"""`ringflow`: run training jobs on this machine.

  ringflow shard DATASET OUT --workers N --batch-size B [--target target] [--seed S]
  ringflow train CONFIG --np N [--engine horovod|ddp] [--controller gloo|mpi]
  ringflow health RUN_URI                   # the verdict on a run's last attempt, by its own thresholds
  ringflow demo [--workdir DIR]             # digits end to end: shard, train on 2 workers
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

from ringflow.training.formats import exit_codes
from ringflow.training.formats.config import ConfigError
from ringflow.training.formats.engines import CONTROLLERS, DEFAULT_CONTROLLER, ENGINES


def cmd_shard(args) -> int:
    from ringflow.training.formats.datasets import open_dataset
    from ringflow.training.core.input_gate import UntrainableData
    from ringflow.training.core.sharding import write_shards
    from ringflow.training.store import open_store

    try:
        with open_dataset(args.dataset) as dataset:  # streamed: memory does not grow with the dataset
            manifest = write_shards(dataset, open_store(args.out), target=args.target,
                                    num_partitions=args.workers, batch_size=args.batch_size, seed=args.seed,
                                    eval_fraction=args.eval_fraction, source_uri=args.dataset)
    except UntrainableData as exc:  # a person's data problem: the message, not a traceback
        print(f"[ringflow] {exc}", file=sys.stderr)
        return exit_codes.ERROR
    print(json.dumps({"partitions": manifest.num_partitions, "rows_per_partition": manifest.partitions[0].rows,
                      "eval_rows": manifest.eval.rows if manifest.eval else 0,
                      "fingerprint": manifest.fingerprint}))
    return 0


def cmd_train(args) -> int:
    from ringflow.training.core.launcher import run_local

    try:
        code = run_local(args.config, args.np, args.controller, engine=args.engine)
    except ConfigError as exc:
        print(f"[ringflow] {exc}", file=sys.stderr)
        return exit_codes.CONFIG
    print(f"[ringflow] job exited with {code} ({exit_codes.MEANING.get(code, 'failed')})", flush=True)
    return code


def cmd_health(args) -> int:
    from ringflow.training.formats.config import HealthConfig
    from ringflow.training.health.heartbeat import read_heartbeat
    from ringflow.training.health.records import read_health
    from ringflow.training.formats.run_folder import RunFolder
    from ringflow.training.health.verdict import judge, thresholds
    from ringflow.training.store import open_store

    store = open_store(args.run)
    records = read_health(store)
    # The thresholds the run was judged by while it ran, stored in its last attempt's `start` record.
    cfg = thresholds(records)
    source = "stored with the run" if cfg is not None else "defaults: the run stored none"
    cfg = cfg or HealthConfig()
    verdict = judge(records, cfg)
    heartbeat = read_heartbeat(RunFolder(store).current_store())  # the current attempt's (run_folder.py)
    doc = verdict.to_dict() | {"thresholds": source, "stall_seconds": cfg.stall_seconds,
                               "heartbeat": dataclasses.asdict(heartbeat) if heartbeat else None}
    print(json.dumps(doc, indent=1, default=str))
    return 0 if not verdict.is_fatal(cfg.stop_on_degraded) else 1


def cmd_demo(args) -> int:
    from ringflow.training.formats.datasets import load_builtin
    from ringflow.training.core.launcher import run_local
    from ringflow.training.core.sharding import write_shards
    from ringflow.training.store import open_store

    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="ringflow-demo-"))
    shards = os.path.join(workdir, "shards")
    write_shards(load_builtin("digits"), open_store(shards), target="target", num_partitions=2, batch_size=32)
    config = {"manifest_uri": os.path.join(shards, "manifest.json"),
              "run_uri": os.path.join(workdir, "run"), "checkpoint": {"every_steps": 20},
              "epochs": 10, "batch_size": 32, "learning_rate": 0.002}
    path = os.path.join(workdir, "job.json")
    with open(path, "w") as fh:
        json.dump(config, fh, indent=1)
    code = run_local(path, 2)
    print(f"[ringflow] demo finished with exit {code}; run folder: {os.path.join(workdir, 'run')}")
    return code


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringflow", description="data-parallel training jobs on this machine")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("shard", help="split a dataset into per-worker partitions")
    s.add_argument("dataset", help="builtin:digits (or digits_images, diabetes, wine), or a .parquet/.csv path or URI")
    s.add_argument("out", help="folder or s3:// URI for the partitions and manifest.json")
    s.add_argument("--workers", type=int, required=True)
    s.add_argument("--batch-size", type=int, required=True)
    s.add_argument("--target", default="target")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--eval-fraction", type=float, default=0.2)
    s.set_defaults(func=cmd_shard)
    t = sub.add_parser("train", help="run a job config on this machine (horovodrun or torchrun)")
    t.add_argument("config", help="job config JSON (path, file:// or s3://)")
    t.add_argument("--np", type=int, default=2, help="number of worker processes")
    t.add_argument("--engine", choices=ENGINES, default=None,
                   help="horovod (horovodrun) or ddp (PyTorch DDP under torchrun); default: the config's `engine`")
    t.add_argument("--controller", choices=CONTROLLERS, default=DEFAULT_CONTROLLER,
                   help=f"Horovod controller (default {DEFAULT_CONTROLLER}: fastest in bench/throughput.py); "
                        f"the ddp engine has none and ignores it")
    t.set_defaults(func=cmd_train)
    h = sub.add_parser("health", help="print the health verdict of a run")
    h.add_argument("run", help="the run's folder or URI (the job config's run_uri)")
    h.set_defaults(func=cmd_health)
    d = sub.add_parser("demo", help="shard digits and train on 2 local workers")
    d.add_argument("--workdir")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
