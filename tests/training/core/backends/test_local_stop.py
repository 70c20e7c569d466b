"""Stop means gone: a local job stopped by the backend leaves no process behind, whatever state its
processes were in, and neither does a job that ends by itself. Real 2-worker jobs, once per way of tracking
processes that this machine allows (a cgroup v2, a cgroup v1 freezer, the subreaper fallback)."""
import json
import logging
import os
import signal
from pathlib import Path

import pytest

from polling import wait_for
from ringflow.training.core.backends.job_spec import JobSpec
from ringflow.training.core.backends.local import LocalProcessBackend
from ringflow.training.core.backends.processes import proc
from ringflow.training.core.backends.processes.tracking import reopen

# background: mostly frozen jobs' stop grace waited out, beside the main lane (scripts/test.sh).
pytestmark = [pytest.mark.job, pytest.mark.background]
TESTS = str(Path(__file__).resolve().parents[2])  # where unruly_model.py is, for the ranks' PYTHONPATH


def job_spec(name, manifest, root: Path, engine="horovod", epochs=1, faults=(), **unruly):
    """A job whose model comes from unruly_model.py (each rank's pid in root/pids.<rank>)."""
    cfg = {"manifest_uri": manifest, "run_uri": str(root / "run"), "epochs": epochs, "log_every_steps": 5,
           "engine": engine, "faults": list(faults),
           "model": {"kind": "custom", "factory": "unruly_model:build",
                     "kwargs": {"out": str(root / "pids")} | unruly}}
    return JobSpec(name=name, config=cfg, num_workers=2, env={"PYTHONPATH": TESTS})


def processes_of(job_dir: Path) -> list[proc.Process]:
    """Every live process of the job, found two ways: what its tracker holds (and its supervisor), and any
    process whose command line names the job's folder (supervisor, `ringflow train`, launcher, ranks)."""
    doc = json.loads((job_dir / "processes.json").read_text())
    found = {p.identity: p for p in reopen(doc["tracking"]).members()}
    for p in proc.snapshot():
        if not p.ended and str(job_dir) in proc.command_line(p.pid):
            found.setdefault(p.identity, p)
    return list(found.values())


def rank_pids(root: Path) -> list[int]:
    return [int((root / f"pids.{rank}").read_text()) for rank in (0, 1)]


def ignores_sigterm(pid: int) -> bool:
    mask = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigIgn"))
    return bool(int(mask.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def assert_all_gone(found: list[proc.Process]) -> None:
    still = [p.describe() for p in found if proc.current(p) is not None]
    assert not still, still


def start_hanging_job(backend, tmp_path, digits_manifest, name, engine="horovod", **unruly):
    """A job that hangs at step 3 on rank 0 (rank 1 waits for it): running until stopped."""
    job_id = backend.launch(job_spec(name, digits_manifest, tmp_path, engine=engine,
                                     faults=[{"kind": "hang", "rank": 0, "step": 3}], **unruly))
    job_dir = Path(backend.work_dir) / job_id
    assert wait_for(lambda: "fault: hanging at step 3" in (job_dir / "output.log").read_text()), \
        (job_dir / "output.log").read_text()[-2000:]
    assert wait_for(lambda: all((tmp_path / f"pids.{r}").exists() for r in (0, 1)))
    return job_id, job_dir


@pytest.mark.parametrize("engine", ["horovod", pytest.param("ddp", id="ddp-torchrun")])
def test_delete_ends_every_process_of_a_frozen_job(tmp_path, digits_manifest, tracking_mode, engine, janitor):
    """Every process of the job frozen with SIGSTOP (as a host that stops scheduling them would): mpirun or
    torchrun cannot pass a signal on, and the supervisor cannot act. Delete still ends each one."""
    if engine == "ddp" and tracking_mode != "cgroup-v2":
        pytest.skip("torchrun's ranks are tracked the same way; one mode shows it")
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=1,
                                  process_tracking=tracking_mode)
    job_id, job_dir = start_hanging_job(backend, tmp_path, digits_manifest, "rf-frozen", engine=engine)
    found = processes_of(job_dir)
    assert set(rank_pids(tmp_path)) <= {p.pid for p in found}
    assert len(found) >= 5, [p.describe() for p in found]  # supervisor, ringflow train, launcher(s), 2 ranks
    for p in found:
        proc.send(p, signal.SIGSTOP)
    assert wait_for(lambda: all(proc.read(p.pid).state == "T" for p in found), timeout=10)
    assert backend.status(job_id).state == "running"

    backend.delete(job_id)

    assert_all_gone(found)
    assert not processes_of(job_dir)
    status = backend.status(job_id)
    assert status.finished and status.state == "failed" and status.reason == "stopped on request", status
    record = json.loads((job_dir / "processes.json").read_text())["tracking"]
    assert record["mode"] == tracking_mode
    if "path" in record:
        assert not os.path.exists(record["path"]), "the job's cgroup is removed"


def test_delete_kills_a_rank_that_ignores_sigterm_behind_a_frozen_mpirun(tmp_path, digits_manifest, janitor, caplog):
    """Rank 0 hangs and ignores SIGTERM, and mpirun, frozen, can neither forward a signal nor kill it: the
    grace period passes and a SIGKILL ends it. (The rank that hangs: rank 1, waiting for it in an
    all-reduce, may end on its own once its peer is gone.) With the tracking the backend picks: each kind's
    kill of a process in any state is tested in processes/test_stop_processes.py.

    First, on the same job: the job ended (its exit code is written), but a process of it is still there (rank 1,
    frozen): the status is running, and names it."""
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=1)
    job_id, job_dir = start_hanging_job(backend, tmp_path, digits_manifest, "rf-stubborn", ignore_sigterm_rank=0)
    found = processes_of(job_dir)
    stubborn, lingers = rank_pids(tmp_path)
    assert ignores_sigterm(stubborn)

    rank1 = proc.read(lingers)
    proc.send(rank1, signal.SIGSTOP)
    assert wait_for(lambda: proc.read(rank1.pid).state == "T", timeout=10)
    (job_dir / "exit_code").write_text("0\n")  # as if the launcher had ended
    status = backend.status(job_id)
    assert status.state == "running" and f"pid {rank1.pid} (T stopped)" in status.reason, status
    (job_dir / "exit_code").unlink()  # it had not: on to the stop

    (mpirun,) = [p for p in found if p.name == "mpirun"]
    proc.send(mpirun, signal.SIGSTOP)

    with caplog.at_level(logging.INFO, logger="ringflow.training.core.backends.local"):
        backend.delete(job_id)

    assert_all_gone(found)
    # The report names it: killed by the backend's SIGKILL, or by the nested `ringflow train`'s own stop
    # (it tracks the ranks it launched too) within the grace period.
    assert f"pid {stubborn} " in caplog.text, caplog.text
    assert backend.status(job_id).reason == "stopped on request"


def test_a_stray_left_by_a_clean_exit_is_killed_and_reported(tmp_path, digits_manifest, janitor):
    """Rank 0 starts a process that leaves its session and parent and ignores SIGTERM; the job ends well.
    The job is not finished until that process is gone, and its log names it (the tracking the backend
    picks; each kind's hold on a process that leaves its tree: processes/test_stop_processes.py)."""
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=1)
    job_id = backend.launch(job_spec("rf-stray", digits_manifest, tmp_path, stray_rank=0))
    job_dir = Path(backend.work_dir) / job_id
    assert wait_for(lambda: (tmp_path / "pids.stray").exists())
    stray = proc.read(int((tmp_path / "pids.stray").read_text()))
    assert stray is not None and ignores_sigterm(stray.pid)
    assert wait_for(lambda: backend.status(job_id).finished), (job_dir / "output.log").read_text()[-2000:]

    assert proc.current(stray) is None
    status = backend.status(job_id)
    assert status.state == "succeeded", status
    log = (job_dir / "output.log").read_text()
    report = next((line for line in log.splitlines() if "outlived the job's launcher" in line), "")
    assert f"killed: pid {stray.pid} " in report, log[-2000:]
    assert not processes_of(job_dir)
