"""`ringflow train` stopped by Ctrl-C or SIGTERM ends every process of its job, even when mpirun, frozen,
cannot pass the signal on (the ranks are in process groups of their own)."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from polling import wait_for
from ringflow.training.core.backends.processes import proc

TESTS = str(Path(__file__).resolve().parents[1])  # unruly_model.py, for the ranks' PYTHONPATH


@pytest.mark.job
@pytest.mark.background  # waits out a frozen mpirun's grace periods: beside the main lane (scripts/test.sh)
@pytest.mark.parametrize("sig, mode", [(signal.SIGTERM, "auto"), (signal.SIGINT, "subreaper")])
def test_interrupted_ringflow_train_ends_every_rank_behind_a_frozen_mpirun(jobs, janitor, sig, mode):
    pids = jobs.root / "pids"
    cfg = jobs.config("interrupted", epochs=1, faults=[{"kind": "hang", "rank": 0, "step": 3}],
                      model={"kind": "custom", "factory": "unruly_model:build",
                             "kwargs": {"out": str(pids), "ignore_sigterm_rank": 1}})
    path = jobs.root / "interrupted.json"
    path.write_text(json.dumps(cfg))
    log = jobs.root / "train.log"
    env = os.environ | {"PYTHONPATH": TESTS, "RINGFLOW_PROCESS_TRACKING": mode, "RINGFLOW_STOP_GRACE_SECONDS": "1",
                        "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        cli = subprocess.Popen([sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np", "2",
                                "--controller", "mpi"], env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    janitor.launcher(cli.pid)
    assert wait_for(lambda: "fault: hanging at step 3" in log.read_text()), log.read_text()[-2000:]
    assert wait_for(lambda: all(Path(f"{pids}.{rank}").exists() for rank in (0, 1)))
    # The launcher chain and the ranks: every process naming the config, but `ringflow train` itself.
    job = [p for p in proc.snapshot() if str(path) in proc.command_line(p.pid) and p.pid != cli.pid and not p.ended]
    ranks = {int(Path(f"{pids}.{rank}").read_text()) for rank in (0, 1)}
    assert ranks <= {p.pid for p in job} and any(p.name == "mpirun" for p in job), [p.describe() for p in job]
    for p in job:
        proc.send(p, signal.SIGSTOP)

    cli.send_signal(sig)

    assert cli.wait(60) != 0
    still = [p.describe() for p in job if proc.current(p) is not None]
    assert not still, still
    assert f"{signal.Signals(sig).name}: stopping every process of the job" in log.read_text()
