"""Where a benchmark's results go: <name>.json and <name>.md in bench/results/ (docs/benchmarks.md links them), or in
the folder --results-dir names (a trial run), each with the command that made them."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def add_results_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """--out NAME (default `name`) and --results-dir DIR (default bench/results/), for write_results."""
    parser.add_argument("--out", default=name, help="results file name, without .md/.json")
    parser.add_argument("--results-dir", type=Path, default=RESULTS,
                        help="folder of the results files (default bench/results/; another keeps a trial run out)")


def command() -> str:
    """The command line that is running, as one runs it from the repository root."""
    module = f"bench.{Path(sys.argv[0]).stem}"  # under `python -m bench.x`, argv[0] is the module's file
    return shlex.join([".venv/bin/python", "-m", module, *sys.argv[1:]])


def write_results(args: argparse.Namespace, summary: dict, lines: list[str], echo: bool = True) -> None:
    """summary as <args.out>.json and lines as <args.out>.md in args.results_dir (add_results_arguments), both
    with the command; (echo) the lines are printed too. A bench that saves as it goes (bind_cores.py) echoes
    only its last save."""
    lines = [*lines, "", f"Command: `{command()}`"]
    folder: Path = args.results_dir
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{args.out}.json").write_text(json.dumps({**summary, "command": command()}, indent=1) + "\n")
    (folder / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    if echo:
        print("\n".join(lines))
