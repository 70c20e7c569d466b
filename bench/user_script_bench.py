"""A user's own training script under ringflow against the same script under its plain launcher, side by side.

bench/user_script/train.py (a DDP or Horovod PyTorch loop) runs, in interleaved repeats, (a) as a ringflow job:
`ringflow train` with the job config's `entry` (its folder bundled and pinned, the training API on: the dataset
dealt by get_dataset_shard, report() every step handing the model and optimizer state, ringflow's checkpoint
cadence and health at their defaults), and (b) plain: the same launcher command ringflow builds (torchrun /
horovodrun with the same settings) running the script file itself, which reads the same shard files into
memory. Both print the samples/s of the steps after the warm-up (start-up not counted: it is the launcher's and
the imports' in both). The ratio is taken per repeat, ringflow over the plain run next to it.

    .venv/bin/python -m bench.user_script_bench [--repeats 3] [--np 2] [--epochs 30]
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

from .common import BATCH, environment, machine, shards, shown_environment, spread
from .results_file import add_results_arguments, write_results

SCRIPT = Path(__file__).resolve().parent / "user_script"
ENGINES = ("ddp", "horovod")


def script_args(engine: str, manifest: str, epochs: int) -> list[str]:
    return ["--engine", engine, "--manifest", manifest, "--epochs", str(epochs), "--batch", str(BATCH)]


def measured(output: str, what: str) -> float:
    # horovodrun prefixes each rank's line ("[1,0]<stdout>:BENCH {...}") and may run another's into it
    found = re.findall(r"BENCH (\{[^{}]*\})", output)
    if not found:
        raise SystemExit(f"{what} printed no BENCH line:\n{output[-3000:]}")
    return json.loads(found[-1])["samples_per_sec"]


def run_ringflow(engine: str, manifest: str, root: Path, np_: int, epochs: int, n: int) -> float:
    config = {"manifest_uri": manifest, "run_uri": str(root / f"run-{engine}-{n}"), "engine": engine,
              "epochs": epochs, "batch_size": BATCH,
              "entry": {"script": "train.py", "folder": str(SCRIPT), "args": script_args(engine, manifest, epochs)}}
    path = root / f"config-{engine}-{n}.json"
    path.write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np", str(np_)],
                          capture_output=True, text=True, env=environment(), timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"ringflow job failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return measured(proc.stdout + proc.stderr, f"ringflow {engine}")


def run_plain(engine: str, manifest: str, np_: int, epochs: int) -> float:
    from ringflow.training.core.launcher import launch_command

    command = launch_command(engine, "unused.json", np_)
    last_m = len(command) - 1 - command[::-1].index("-m")  # `-m ringflow.training CONFIG` -> the script file
    command = command[:last_m] + [str(SCRIPT / "train.py"), *script_args(engine, manifest, epochs)]
    proc = subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"plain {engine} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return measured(proc.stdout + proc.stderr, f"plain {engine}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--engines", default=",".join(ENGINES))
    add_results_arguments(parser, "user_script")
    args = parser.parse_args()
    engines = args.engines.split(",")
    rows, summary = [], {"machine": machine(), "environment": shown_environment(), "np": args.np,
                         "epochs": args.epochs, "batch": BATCH, "engines": {}}
    with tempfile.TemporaryDirectory(prefix="ringflow-bench-script-") as tmp:
        root = Path(tmp)
        manifest = shards(root, args.np)
        for engine in engines:
            pairs = []
            for n in range(args.repeats):  # interleaved, the order alternating: drift cancels out
                first_plain = n % 2 == 1
                plain = run_plain(engine, manifest, args.np, args.epochs) if first_plain else None
                ours = run_ringflow(engine, manifest, root, args.np, args.epochs, n)
                plain = plain if plain is not None else run_plain(engine, manifest, args.np, args.epochs)
                pairs.append((ours, plain))
                print(f"{engine} repeat {n + 1}: ringflow {ours:,.0f} samples/s, plain {plain:,.0f} samples/s, "
                      f"{ours / plain:.3f}x", flush=True)
            ratios = [o / p for o, p in pairs]
            summary["engines"][engine] = {"ringflow": [o for o, _ in pairs], "plain": [p for _, p in pairs],
                                          "ratio": ratios, "median_ratio": statistics.median(ratios)}
            rows.append(f"| {engine} | {spread([o for o, _ in pairs], 0)} | {spread([p for _, p in pairs], 0)} | "
                        f"**{statistics.median(ratios):.3f}x** ({min(ratios):.3f}-{max(ratios):.3f}) |")
    lines = [f"# A user's script under ringflow vs its plain launcher (np={args.np}, {args.repeats} interleaved "
             f"repeats, samples/s after {30} warm-up steps)", "",
             "| engine | ringflow (API on, defaults) | plain torchrun / horovodrun | ringflow / plain, per repeat |",
             "|---|---|---|---|", *rows, "",
             f"Script: bench/user_script/train.py (MLP 128-256-256-10, batch {BATCH} per worker, Adam, "
             f"{args.epochs} epochs of 8192 rows per worker); ringflow reports every step with the model and optimizer "
             "state handed for its default checkpoint cadence (every 50 steps, at most one per 30 s).",
             f"Machine: {summary['machine']}"]
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
