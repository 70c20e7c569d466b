"""Where a checkpoint of the 100 MB model's state goes (checkpoint_overhead.py's model, Adam, ~300 MB): each
part of the asynchronous writer timed on its own, the way it was done before against the way it is done now,
in interleaved repeats in one process (one torch thread).

- the snapshot on the training thread: TrainingState.host_copy into new memory (before) or into the last
  snapshot's (now);
- the NaN/Inf check on the writer's thread: torch.isfinite(t).all() per tensor (before) or
  training_state.all_finite (now);
- serialising (TrainingState.save): with the zip format's CRC32 of every record (before) or without (now);
- what is left as it was: the sha256 of the file (checkpoint.py) and its copy into a local run folder
  (LocalFolderStore.put_file, fsync included).

    .venv/bin/python -m bench.checkpoint_profile [--repeats 5] [--out NAME] [--results-dir DIR]

Results: bench/results/<out>.json and .md.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from .checkpoint_overhead import CLASSES, FEATURES, HIDDEN
from .results_file import add_results_arguments, write_results


def timed(call) -> tuple[float, float]:
    """(wall seconds, this thread's CPU seconds) of `call()`."""
    wall, cpu = time.perf_counter(), time.thread_time()
    call()
    return time.perf_counter() - wall, time.thread_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    add_results_arguments(p, "checkpoint_profile")
    args = p.parse_args()
    import torch

    from ringflow.training.rank.models import TabularMLP
    from ringflow.training.store import LocalFolderStore
    from ringflow.training.rank.training_state import TrainingState, all_finite

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TabularMLP(FEATURES, CLASSES, tuple(HIDDEN))
    optimizer = torch.optim.Adam(model.parameters())
    x, y = torch.randn(args.batch, FEATURES), torch.randint(0, CLASSES, (args.batch,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()  # Adam's moments exist: the state a checkpoint holds
    live = TrainingState(model=model.state_dict(), optimizer=optimizer.state_dict(), cursor=(0, 0), step=1,
                         torch_rng=torch.get_rng_state())
    folder = Path(tempfile.mkdtemp(prefix="ringflow-checkpoint-profile-"))
    store = LocalFolderStore(folder / "run")
    path = str(folder / "state.pt")
    last = live.host_copy()

    def isfinite_mask(state: TrainingState) -> bool:
        tensors = [*state.model.values(), *(t for s in state.optimizer["state"].values() for t in s.values())]
        return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())

    def all_finite_now(state: TrainingState) -> bool:
        return not state.nonfinite_tensors()

    def save_with_crc32() -> None:
        torch.serialization.set_crc32_options(True)
        torch.save({"model": last.model, "optimizer": last.optimizer, "cursor": [0, 0], "step": 1,
                    "torch_rng": last.torch_rng}, path)

    def sha256() -> None:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)

    parts = {
        "snapshot into new memory (before)": lambda: live.host_copy(),
        "snapshot into the last snapshot (now)": lambda: live.host_copy(into=last),
        "NaN/Inf check, isfinite mask (before)": lambda: isfinite_mask(last),
        "NaN/Inf check, all_finite (now)": lambda: all_finite_now(last),
        "serialise with CRC32 (before)": save_with_crc32,
        "serialise without CRC32 (now)": lambda: last.save(path),
        "sha256 of the file (as before)": sha256,
        "copy into the local run folder, fsync (as before)": lambda: store.put_file("state.pt", path),
    }
    assert all_finite(torch.ones(3))
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in parts}
    for _ in range(args.repeats):  # interleaved: the machine's drift hits every part alike
        for name, call in parts.items():
            seconds[name].append(timed(call))
    size = os.path.getsize(path)
    summary = {"model": {"features": FEATURES, "hidden": HIDDEN, "parameters": sum(p.numel() for p in model.parameters())},
               "state_bytes": size, "repeats": args.repeats,
               "parts": {name: {"wall": [w for w, _ in v], "cpu": [c for _, c in v]} for name, v in seconds.items()}}
    lines = [f"Each part of a checkpoint of the 100 MB model's state (MLP {FEATURES}->{HIDDEN}->{CLASSES}, Adam: "
             f"{size / 2**20:.0f} MiB in state.pt), timed alone in one process, one torch thread, {args.repeats} "
             "interleaved repeats; medians (min–max). CPU: the calling thread's CPU time. 2 cores shared with other "
             "work: wall times stretch with the load, CPU times much less.", "",
             "| part | CPU s | wall s |", "|---|---|---|"]
    for name, v in seconds.items():
        walls, cpus = [w for w, _ in v], [c for _, c in v]
        lines.append(f"| {name} | {statistics.median(cpus):.3f} ({min(cpus):.3f}–{max(cpus):.3f}) | "
                     f"{statistics.median(walls):.3f} ({min(walls):.3f}–{max(walls):.3f}) |")
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
