"""Where a benchmark's results go: bench/results/<name>.json and <name>.md, each with the command that made
them (the README links them)."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def command() -> str:
    """The command line that is running, as one runs it from the repository root."""
    return shlex.join([".venv/bin/python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def write_results(name: str, summary: dict, lines: list[str], echo: bool = True) -> None:
    """summary as <name>.json and lines as <name>.md, both with the command; (echo) the lines are printed too.
    A bench that saves as it goes (bind_cores.py) echoes only its last save."""
    lines = [*lines, "", f"Command: `{command()}`"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({**summary, "command": command()}, indent=1))
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    if echo:
        print("\n".join(lines))
