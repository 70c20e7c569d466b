"""Many promoters of one model at the same moment, each in its own process (imported by the registry
and promote tests; run as a script it is one promoter).

Each process starts, imports everything and opens its store, says "ready", then waits for one line
on stdin: the parent sends it to all of them at once only when every one is ready, so the
promotions themselves overlap instead of the imports. Each prints one JSON line: what it got.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

READY = "ready"


def race(specs: list[dict], env: dict[str, str] | None = None, timeout: float = 240.0) -> list[dict]:
    """Run one promoter per spec, released together; their outcomes in spec order.

    A spec is {"store": uri, "model": name, "run": run prefix, "checkpoint": name, "metrics": {...}}
    for ModelRegistry.promote, or {"operator": {PromoteModelOperator kwargs}} for the promote task.
    """
    # One pipe per process (stderr into stdout): reading it whole cannot deadlock on the other one.
    procs = [subprocess.Popen([sys.executable, __file__, json.dumps(spec)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, **(env or {})}) for spec in specs]
    try:
        deadline = time.monotonic() + timeout
        for proc in procs:  # the barrier: every promoter is ready before any starts
            line = "-"
            while line and line.strip() != READY:  # skip whatever a library printed first
                line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"a promoter did not start:\n{proc.stdout.read()[-4000:]}")
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            proc.stdin.close()
        outcomes = []
        for proc in procs:
            out = proc.stdout.read()
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if proc.returncode != 0 or not out.strip():
                raise AssertionError(f"a promoter exited with {proc.returncode}:\n{out[-4000:]}")
            outcomes.append(json.loads(out.strip().splitlines()[-1]))
        return outcomes
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _main(spec: dict) -> dict:
    if "operator" in spec:
        from ringflow.operators.promote import PromoteModelOperator

        op = PromoteModelOperator(task_id="promote", **spec["operator"])
        run = lambda: op.execute(context={})  # noqa: E731
    else:
        from ringflow.training.core.registry.model_registry import ModelRegistry
        from ringflow.training.store import open_store

        registry = ModelRegistry(open_store(spec["store"]))

        def run() -> dict:
            run_uri = f"{registry.store.uri.rstrip('/')}/{spec['run']}"
            p = registry.promote(spec["model"], run_uri=run_uri, checkpoint=spec["checkpoint"], metrics=spec["metrics"])
            return {"version": p.version, "promoted": p.promoted, "new_version": p.new_version,
                    "previous": p.previous, "revision": p.pointer.revision if p.pointer else None}
    print(READY, flush=True)
    sys.stdin.readline()
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - reported to the test, which decides
        return {"error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    print(json.dumps(_main(json.loads(sys.argv[1]))), flush=True)
