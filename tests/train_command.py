"""`ringflow train` as the job tests run it: its exit code and output, and, when it outlives its timeout, a
failure that keeps the evidence (the output's tail and the job's processes, with their state and threads'
kernel waits, read before they are killed), not a bare TimeoutExpired (a hang once went unexplained, its
output and processes gone with the test's temporary folder)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

OUTPUT_TAIL = 12_000


def run_train(config: Path, *args: str, timeout: float) -> tuple[int, str]:
    command = [sys.executable, "-m", "ringflow.training.core.cli", "train", str(config), *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"}, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        processes = describe_tree(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"`ringflow train {config.name} {' '.join(args)}` still ran after {timeout:g} s; its "
                    f"processes then:\n{processes}\nits output's tail:\n{out[-OUTPUT_TAIL:]}", pytrace=False)
    return proc.returncode, out


def describe_tree(root: int) -> str:
    """Every process under `root`: pid, state, command line, and each thread's name and kernel wait."""
    lines, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            threads = []
            for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
                name = (task / "comm").read_text().strip()
                wchan = (task / "wchan").read_text().strip() if (task / "wchan").exists() else "?"
                threads.append(f"{name}:{wchan}")
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        lines.append(f"  {pid} {stat[0]} {cmdline}\n    threads: {', '.join(threads)}")
        lines.extend(python_stacks(pid))
        todo.extend(int(child) for child in children)
    return "\n".join(lines)


def python_stacks(pid: int) -> list[str]:
    """Each thread's Python stack in `pid`, by py-spy where it is on PATH (it is not one of the project's
    dependencies: put it there to read a hang), else nothing."""
    spy = shutil.which("py-spy")
    if spy is None:
        return []
    try:
        dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"    py-spy: {exc}"]
    return ["    " + line for line in (dump.stdout + dump.stderr).splitlines()]
