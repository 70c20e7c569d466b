"""`ringflow`: the pipeline's steps from a shell, the same core functions the Airflow operators run.

  ringflow validate DATASET --suite SUITE [--target T]   # a Great Expectations suite, streamed
  ringflow shard DATASET OUT --partitions N --batch-size B [--target target] [--seed S]
  ringflow train CONFIG --np N [--engine ENGINE] [--controller C] [--retries N [--remediation auto]]
  ringflow health RUN_URI                   # the verdict on a run's last attempt, by its own thresholds
  ringflow evaluate RUN_URI [--checkpoint NAME]          # eval.json of the final checkpoint
  ringflow promote RUN_URI --registry URI --model NAME [--metric M --mode max|min --threshold X ...]
  ringflow rollback --registry URI --model NAME [--to VERSION]
  ringflow demo [--workdir DIR]             # digits end to end: shard, train on 2 workers

Bad arguments (not a positive number, a file that is not there, a name not among the choices) are refused
by the parser, before anything runs: a usage line and one error line saying what to give, exit 2 (= CONFIG).
Bad input found while a command runs (a malformed suite or config, data training cannot use, a run not ready
to promote) is answered with one line on stderr naming the problem and the fix, and the exit code of
exit_codes.py: CONFIG for what the command was given, ERROR for a step that ran and failed (a dataset that
breaks its suite, a promotion the gate refuses). S3 settings come from the environment (RINGFLOW_S3_ENDPOINT, AWS_*).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
import urllib.parse

from ..formats import exit_codes
from ..formats.config import REMEDIATIONS, ConfigError
from ..formats.engines import CONTROLLERS, DEFAULT_CONTROLLER, DEFAULT_ENGINE, ENGINES, TABLE
from ..health.verdict import DEGRADED, FATAL, FENCED, HEALTHY
from .gate import DEFAULT_ALLOWED_VERDICTS, MODES


def refuse(problem: BaseException | str, code: int) -> int:
    """Say what is wrong on one line of stderr (the problem and the fix, no traceback); return `code`."""
    print(f"[ringflow] {' '.join(str(problem).split())}", file=sys.stderr)
    return code


def bad_input_errors() -> tuple[type[BaseException], ...]:
    """What a command's input can be wrong with, each error's message naming the problem and the fix. Imported
    when a command failed, so a command loads only what it uses (torch, GX) while it runs."""
    from ..formats.checkpoint import CheckpointCorrupt
    from ..formats.code_bundle import BundleError
    from ..formats.engines import EngineError
    from .gate import GateError
    from .run_reader import RunNotReady
    from ..formats.eval_result import EvalResultError
    from ..formats.manifest import ManifestError
    from .registry.model_registry import RegistryError
    from ..formats.run_folder import RunFolderError
    from ..formats.run_result import ResultError
    from ..store import ObjectNotFound, StoreConfigError

    errors = (ConfigError, ManifestError, ObjectNotFound, StoreConfigError, RunNotReady, GateError, RegistryError,
              EvalResultError, ResultError, RunFolderError, CheckpointCorrupt, EngineError, BundleError)
    for module, name in (("ringflow.training.formats.datasets", "DatasetError"),
                         ("ringflow.training.core.validation.suite", "SuiteError"),
                         ("ringflow.training.rank.training_state", "UnsafeCheckpoint")):
        if module in sys.modules:  # only a module that ran can have raised it
            errors += (getattr(sys.modules[module], name),)
    return errors


def data_problem_errors() -> tuple[type[BaseException], ...]:
    """A step that ran on good input and found the data unusable: ERROR, not CONFIG."""
    if "ringflow.training.core.input_gate" not in sys.modules:
        return ()
    return (sys.modules["ringflow.training.core.input_gate"].UntrainableData,)


def cmd_validate(args) -> int:
    from .validation.stream import validate_dataset
    from .validation.suite import load_suite
    from ..formats.datasets import open_dataset

    suite = load_suite(args.suite)
    with open_dataset(args.dataset) as dataset:  # streamed, as the operator does
        summary = validate_dataset(dataset, suite, target=args.target)
    print(json.dumps(summary.report(args.dataset)))
    if not summary.success:  # the report, one finding a line: the step's result, not a traceback
        print(summary.message(args.dataset), file=sys.stderr)
        return exit_codes.ERROR
    return exit_codes.OK


def cmd_shard(args) -> int:
    from ..formats.datasets import open_dataset
    from .sharding import write_shards
    from ..store import open_store

    with open_dataset(args.dataset) as dataset:  # streamed: memory does not grow with the dataset
        manifest = write_shards(dataset, open_store(args.out), target=args.target,
                                num_partitions=args.partitions, batch_size=args.batch_size, seed=args.seed,
                                eval_fraction=args.eval_fraction, source_uri=args.dataset)
    print(json.dumps({"partitions": manifest.num_partitions, "rows_per_partition": manifest.partitions[0].rows,
                      "eval_rows": manifest.eval.rows if manifest.eval else 0,
                      "fingerprint": manifest.fingerprint}))
    return 0


def cmd_train(args) -> int:
    from .local_retries import train_with_retries

    return train_with_retries(args.config, args.np, retries=args.retries, remediation=args.remediation,
                              controller=args.controller, engine=args.engine,
                              verify_all_shard_bytes=args.verify_shards)


def cmd_health(args) -> int:
    from ..formats.config import HealthConfig
    from ..formats.run_folder import RunFolder
    from ..health.verdict import judge, thresholds

    run = RunFolder.open(args.run)
    records = run.read_health()
    # The thresholds the run was judged by while it ran, stored in its last attempt's `start` record.
    cfg = thresholds(records)
    source = "stored with the run" if cfg is not None else "defaults: the run stored none"
    cfg = cfg or HealthConfig()
    verdict = judge(records, cfg)
    heartbeat = run.read_heartbeat()  # the current attempt's
    doc = verdict.to_dict() | {"thresholds": source, "stall_seconds": cfg.stall_seconds,
                               "heartbeat": dataclasses.asdict(heartbeat) if heartbeat else None}
    print(json.dumps(doc, indent=1, default=str))
    return 0 if not verdict.is_fatal(cfg.stop_on_degraded) else 1


def cmd_evaluate(args) -> int:
    from .evaluate import evaluate

    print(json.dumps(evaluate(args.run, args.checkpoint), indent=1))  # S3 settings: the environment's
    return exit_codes.OK


def cmd_promote(args) -> int:
    from .gate import build_gate
    from .promotion import promote_run
    from ..store import open_store

    gate = build_gate(metric=args.metric, mode=args.mode, threshold=args.threshold,
                      compare_to_production=not args.ignore_production,
                      allowed_verdicts=None if args.any_verdict else args.allowed_verdicts)
    outcome = promote_run(open_store(args.registry), args.registry, args.run, args.model, gate)
    print(json.dumps(outcome.to_dict(), indent=1))
    if not outcome.promoted:  # a normal outcome, but a script's `&& deploy` must not go on
        return refuse(outcome.refusal(args.model), exit_codes.ERROR)
    return exit_codes.OK


def cmd_rollback(args) -> int:
    from .registry.model_registry import ModelRegistry
    from ..store import open_store

    pointer = ModelRegistry(open_store(args.registry)).rollback(args.model, to_version=args.to,
                                                                from_version=args.from_version)
    print(json.dumps(dataclasses.asdict(pointer), indent=1))
    return exit_codes.OK


def cmd_demo(args) -> int:
    from ..formats.datasets import load_builtin
    from .launcher import run_local
    from .sharding import write_shards
    from ..store import open_store

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


# -- arguments: each checked where it is parsed ----------------------------------------------------------------
# A type below raises ArgumentTypeError saying what to give; argparse prints the usage and that one line and
# exits 2 (exit_codes.CONFIG), before any command runs.

def whole_number_from(low: int):
    """The argument type of a whole number >= `low`."""
    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= {low}")
        return value

    return whole_number


whole_number, positive_number = whole_number_from(0), whole_number_from(1)


def fraction(text: str) -> float:
    """A number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text!r}: give a fraction >= 0 and < 1, e.g. 0.2")
    return value


def finite_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number, e.g. 0.9")
    return value


def name(text: str) -> str:
    """A non-empty name (a column, a metric, a checkpoint)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name: give one, e.g. target")
    return text


def model_name(text: str) -> str:
    from .registry.model_registry import MODEL_NAME_PATTERN

    if not re.match(MODEL_NAME_PATTERN, text):
        raise argparse.ArgumentTypeError(f"{text!r}: give a model name of letters, digits, '.', '_' or '-' "
                                         f"(one path segment)")
    return text


def _local_path(text: str) -> str | None:
    """The local path `text` names (a path or file:// URI); None for an s3:// URI, checked when it is read."""
    scheme = urllib.parse.urlsplit(text).scheme
    if scheme == "s3":
        return None
    if scheme == "file":
        return urllib.parse.urlsplit(text).path
    if scheme and len(scheme) > 1:  # a one-letter scheme is a Windows drive
        raise argparse.ArgumentTypeError(f"{text!r}: give a path, a file:// or an s3:// URI")
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a path, a file:// or an s3:// URI")
    return text


def _existing(text: str, kind: str) -> str:
    """A file or folder (`kind`) that is there, or an s3:// URI."""
    path = _local_path(text)
    if path is not None and not (os.path.isfile(path) if kind == "file" else os.path.isdir(path)):
        there = "does not exist" if not os.path.exists(path) else "is a folder" if kind == "file" else "is a file"
        raise argparse.ArgumentTypeError(f"{text!r} {there}: give the path of an existing {kind} (or an s3:// URI)")
    return text


def existing_file(text: str) -> str:
    return _existing(text, "file")


def existing_folder(text: str) -> str:
    return _existing(text, "folder")


def new_or_existing_folder(text: str) -> str:
    """A folder to write into: there already or not (created), but not a file."""
    path = _local_path(text)
    if path is not None and os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text!r} is a file: give a folder to write into (or an s3:// URI)")
    return text


def dataset(text: str) -> str:
    """builtin:<name> of the built-in datasets, or a .parquet/.csv file that is there (or an s3:// URI)."""
    if text.startswith("builtin:"):
        from ..formats.datasets import BUILTIN

        if text[len("builtin:"):] not in BUILTIN:
            raise argparse.ArgumentTypeError(f"{text!r}: unknown built-in dataset; give one of "
                                             f"{', '.join('builtin:' + b for b in BUILTIN)}, or a .parquet/.csv path")
        return text
    return existing_file(text)


def _engines_help() -> str:
    """Every engine of the engine table (formats/engines.py), with what starts its ranks."""
    return "; ".join(f"{n}: {'one process per worker, started by ringflow' if e.starts_workers_itself else e.launcher}"
                     for n, e in TABLE.items())


# Every verdict a run's health can have (health/verdict.py; FENCED is an attempt's, never a run's), for
# --allowed-verdicts.
VERDICTS = (HEALTHY, DEGRADED) + tuple(v for v in FATAL if v != FENCED)


class RenamedOption(argparse.Action):
    """An option's old spelling: refused in one line that names the new one."""

    def __init__(self, option_strings, dest, now: str = "", **kwargs):
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.now = now

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is now {self.now}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringflow", description="data-parallel training jobs on this machine")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check a dataset against a Great Expectations suite (nothing written)")
    v.add_argument("dataset", type=dataset, help="builtin:<name>, or a .parquet/.csv path or URI")
    v.add_argument("--suite", type=existing_file, required=True,
                   help='suite JSON file: {"name": ..., "expectations": [...]}')
    v.add_argument("--target", type=name, default="target",
                   help="the target column; the others are features, checked to hold finite numbers whatever the "
                        "suite says")
    v.set_defaults(func=cmd_validate)
    s = sub.add_parser("shard", help="split a dataset into partition files (any number of workers trains on them)")
    s.add_argument("dataset", type=dataset,
                   help="builtin:digits (or digits_images, diabetes, wine), or a .parquet/.csv path or URI")
    s.add_argument("out", type=new_or_existing_folder, help="folder or s3:// URI for the partitions and manifest.json")
    s.add_argument("--partitions", type=positive_number, required=True, metavar="N",
                   help="partition files to write (storage only: a run trains on them with any number of workers)")
    s.add_argument("--workers", action=RenamedOption, nargs="?",
                   now="--partitions N (the number of partition files to write)")
    s.add_argument("--batch-size", type=positive_number, required=True, metavar="B",
                   help="rows per minibatch; every partition holds whole minibatches")
    s.add_argument("--target", type=name, default="target", help="the target column")
    s.add_argument("--seed", type=whole_number, default=0, metavar="S", help="the shuffle's seed (default 0)")
    s.add_argument("--eval-fraction", type=fraction, default=0.2,
                   help="the share of rows held out for evaluation (default 0.2)")
    s.set_defaults(func=cmd_shard)
    t = sub.add_parser("train", help=f"run a job config on this machine (engines: {', '.join(ENGINES)})")
    t.add_argument("config", type=existing_file, help="job config JSON (path, file:// or s3://)")
    t.add_argument("--np", type=positive_number, default=2, metavar="N", help="number of worker processes (default 2)")
    t.add_argument("--engine", choices=ENGINES, default=None,
                   help=f"{_engines_help()}. Default: the config's `engine` ({DEFAULT_ENGINE} if it names none)")
    without = [n for n, e in TABLE.items() if not e.controllers]
    t.add_argument("--controller", choices=CONTROLLERS, default=DEFAULT_CONTROLLER,
                   help=f"Horovod controller (default {DEFAULT_CONTROLLER}: fastest in bench/throughput.py); "
                        f"the {' and '.join(without)} engines have none and ignore it")
    t.add_argument("--verify-shards", action="store_true",
                   help="before launching, read every shard and check each row group's sha256 (default: sizes and "
                        "footers only; the ranks check every row group as they read it)")
    t.add_argument("--retries", type=whole_number, default=0, metavar="N",
                   help="tries after a failed one, each as the failure policy and core/attempts.py say (a retry "
                        "resumes from the last checkpoint; default 0)")
    t.add_argument("--remediation", choices=REMEDIATIONS, default=None,
                   help="overrides the config's `remediation`: auto changes a retry after a health verdict")
    t.set_defaults(func=cmd_train)
    h = sub.add_parser("health", help="print the health verdict of a run")
    h.add_argument("run", type=existing_folder, help="the run's folder or URI (the job config's run_uri)")
    h.set_defaults(func=cmd_health)
    e = sub.add_parser("evaluate", help="score a run's final checkpoint on the held-out split (writes eval.json)")
    e.add_argument("run", type=existing_folder, help="the run's folder or URI (the job config's run_uri)")
    e.add_argument("--checkpoint", type=name, help="a published checkpoint's name (default: the one result.json names)")
    e.set_defaults(func=cmd_evaluate)
    pr = sub.add_parser("promote", help="copy an evaluated run's checkpoint into the registry and point "
                                        "production at it, if the gate allows")
    pr.add_argument("run", type=existing_folder, help="the run's folder or URI, inside the registry's store")
    pr.add_argument("--registry", type=existing_folder, required=True,
                    help="the model registry's store (folder or s3:// URI)")
    pr.add_argument("--model", type=model_name, required=True, help="the model's name in the registry")
    pr.add_argument("--metric", type=name, default="accuracy", help="the metric of eval.json the gate compares")
    pr.add_argument("--mode", choices=MODES, default="max", help="max (higher is better) or min")
    pr.add_argument("--threshold", type=finite_number, help="an absolute bar the metric must reach (default: none)")
    pr.add_argument("--ignore-production", action="store_true",
                    help="do not require the run to be no worse than the model in production")
    pr.add_argument("--allowed-verdicts", nargs="+", choices=VERDICTS, default=list(DEFAULT_ALLOWED_VERDICTS),
                    metavar="VERDICT",
                    help=f"health verdicts that may be promoted, of {' '.join(VERDICTS)} "
                         f"(default: {' '.join(DEFAULT_ALLOWED_VERDICTS)})")
    pr.add_argument("--any-verdict", action="store_true", help="promote whatever the health verdict")
    pr.set_defaults(func=cmd_promote)
    rb = sub.add_parser("rollback", help="point production back at the previous version (or --to VERSION)")
    rb.add_argument("--registry", type=existing_folder, required=True,
                    help="the model registry's store (folder or s3:// URI)")
    rb.add_argument("--model", type=model_name, required=True, help="the model's name in the registry")
    rb.add_argument("--to", type=positive_number,
                    help="the version to put back in production (default: the previous one)")
    rb.add_argument("--from-version", type=positive_number,
                    help="roll back only if production is still this version (default: whichever is in it)")
    rb.set_defaults(func=cmd_rollback)
    d = sub.add_parser("demo", help="shard digits and train on 2 local workers")
    d.add_argument("--workdir", type=new_or_existing_folder,
                   help="the folder for the shards, the job config and the run (default: a new temporary one)")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:
        if isinstance(exc, data_problem_errors()):  # the step ran and the data cannot be used
            return refuse(exc, exit_codes.ERROR)
        if isinstance(exc, bad_input_errors()):
            return refuse(exc, exit_codes.CONFIG)
        raise  # not bad input: a bug, whose traceback is wanted


if __name__ == "__main__":
    sys.exit(main())
