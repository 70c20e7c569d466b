"""A rank that runs out of memory, for real, on 2 local ranks: each OOM that can be provoked here ends the job
with the OOM verdict naming the rank, the step and the memory it had, and the survivor does not hang in its
all-reduce (a hang would run into the subprocess timeout: stall_seconds is set far beyond it).

- the kernel's OOM killer, on a rank in a memory cgroup of its own (memory.limit_in_bytes; root), under
  Horovod, through the local backend and the Airflow trigger: the operator's path;
- Python's MemoryError, past an RLIMIT_AS cap (what prlimit sets), on rank 1 under DDP: `ringflow train`;
- torch's CPU allocator failing past the same cap, on rank 0 under Horovod: its result.json and record.
- numpy's allocator refusing 2**48 bytes in a TensorFlow worker's step (TensorFlow's ResourceExhaustedError), on
  worker 1: the TensorFlow job ends as a torch job does (tf_memory_hungry_model.py).
The model that runs out is tests/training/memory_hungry_model.py. Kubernetes' OOMKilled is the emulator's
(kubernetes/test_mpijob_backend.py); the classification of every kind, tests/training/health/test_oom.py.
"""
import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from memory_cgroup import CgroupUnavailable, memory_cgroup
from ringflow.training.formats import exit_codes
from ringflow.training.health.verdict_line import VERDICT_LINE, verdict_in_log

pytestmark = pytest.mark.job

HERE = Path(__file__).parent
MiB = 2**20
AT_STEP = 3
# A survivor that hung would time out, not stall; rank 0 beats often, so a killed rank's step is known.
NO_STALL = {"stall_seconds": 900, "every_steps": 1, "heartbeat_seconds": 0.25}


def hungry(how, oom_rank, **more):
    return {"kind": "custom", "factory": "memory_hungry_model:build",
            "kwargs": {"how": how, "oom_rank": oom_rank, "at_step": AT_STEP, **more}}


@pytest.fixture
def ranks_find_the_model(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))


def test_the_kernel_oom_killer_on_a_local_rank_through_the_trigger(tmp_path, digits_manifest, ranks_find_the_model):
    from ringflow.operators.trigger import TrainJobTrigger
    from ringflow.training.core.backends.job_spec import JobSpec
    from ringflow.training.core.backends.local import LocalProcessBackend
    from ringflow.training.core.failure_policy import Action, Observation, decide

    try:
        cap = memory_cgroup(256 * MiB, "oom-rank")
        group = cap.__enter__()
    except CgroupUnavailable as exc:
        pytest.skip(f"needs a memory cgroup of its own: {exc}")
    try:
        backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"))
        config = {"manifest_uri": digits_manifest, "run_uri": str(tmp_path / "run"), "epochs": 1, "batch_size": 32,
                  "health": NO_STALL, "model": hungry("kernel", 1, cgroup=str(group.path))}
        job_id = backend.launch(JobSpec(name="rf-oom", config=config, num_workers=2))
        trigger = TrainJobTrigger(backend_kind="local", backend_kwargs=backend.to_dict(), job_id=job_id,
                                  run_uri=config["run_uri"], health=NO_STALL, poll_interval=0.5,
                                  timeout_at=None)

        async def one_event():
            return [event.payload async for event in trigger.run()]

        (event,) = asyncio.run(asyncio.wait_for(one_event(), 300))
        oom_kills = group.oom_kills()
    finally:
        cap.__exit__(None, None, None)
    assert oom_kills == 1
    verdict = event["verdict"]
    assert verdict["status"] == "OOM" and verdict["evidence"]["kind"] == "kernel_oom_killer", event
    assert verdict["evidence"]["rank"] == 1 and verdict["evidence"]["limit_bytes"] == 256 * MiB
    assert 1 <= verdict["evidence"]["step"] <= AT_STEP  # rank 0's last record or heartbeat, plus one
    assert "rank 1 ran out of memory" in event["message"] and "batch_size 32 -> 16" in event["message"]
    decision = decide(Observation.from_dict(json.loads(json.dumps(event))))
    # Seen in the log while the job tears down (then the operator stops it), or once it ended: no retry.
    assert decision.action == Action.FAIL and decision.exit_code in (None, exit_codes.BY_VERDICT["OOM"]), decision
    # The survivor ended with the job on its own: nothing of it is left, and the job exited with the OOM's code.
    status = wait_until_finished(backend, job_id)
    assert status.exit_code == exit_codes.BY_VERDICT["OOM"] == 9, status
    log = (tmp_path / "jobs" / job_id / "output.log").read_text()
    assert VERDICT_LINE in log and "health verdict OOM" in log


def wait_until_finished(backend, job_id, seconds=60):
    deadline = time.monotonic() + seconds
    while not (status := backend.status(job_id)).finished:
        assert time.monotonic() < deadline, f"the job did not end on its own within {seconds} s: {status}"
        time.sleep(0.2)
    return status


def test_memory_error_on_rank_1_under_ddp(jobs, ranks_find_the_model):
    cfg = jobs.config("memory-error", epochs=1, engine="ddp", health=NO_STALL, model=hungry("memory_error", 1))
    code, out = jobs.run(cfg, timeout=300)
    assert code == exit_codes.BY_VERDICT["OOM"], out
    assert f"rank 1: health verdict OOM: rank 1 ran out of memory at step {AT_STEP}: Python's MemoryError" in out
    assert "RLIMIT_AS" in out and "ddp.backward_passes_per_step 1 -> 2" in out


def test_torch_oom_on_rank_0_under_horovod_is_its_result(jobs, ranks_find_the_model):
    cfg = jobs.config("torch-oom", epochs=1, health=NO_STALL, model=hungry("torch", 0))
    code, out = jobs.run(cfg, timeout=300)
    assert code == exit_codes.BY_VERDICT["OOM"], out
    verdict = jobs.result(cfg).verdict
    assert verdict.status == "OOM" and verdict.evidence["kind"] == "torch_oom", verdict
    e = verdict.evidence
    assert (e["rank"], e["step"], e["requested_bytes"]) == (0, AT_STEP, 8 * 2**30)
    assert e["limit_source"].startswith("RLIMIT_AS") and e["peak_rss_bytes"] > 0
    assert [r for r in jobs.health(cfg) if r["type"] == "oom"][0]["evidence"]["rank"] == 0


@pytest.mark.background  # most of it is two workers importing TensorFlow, one core each at most
def test_memory_error_on_tensorflow_worker_1_ends_the_job(jobs, ranks_find_the_model, tf_python):
    model = {"kind": "custom", "factory": "tf_memory_hungry_model:build", "kwargs": {"oom_rank": 1, "at_step": AT_STEP}}
    cfg = jobs.config("tf-memory-error", epochs=1, engine="tensorflow", health=NO_STALL, model=model)
    code, out = jobs.run(cfg, timeout=300)
    # Worker 0 waits in the step's all-reduce: the launcher stops it once worker 1 has ended (a hang would
    # run into the timeout), and the job exits with the OOM's code.
    assert code == exit_codes.BY_VERDICT["OOM"], out[-3000:]
    said = f"rank 1 ran out of memory at step {AT_STEP}: TensorFlow's ResourceExhaustedError"
    assert f"rank 1: health verdict OOM: {said}" in out, out[-3000:]  # worker 1's own word
    assert f"[ringflow] health verdict OOM: {said}" in out  # the launcher's, from the line it read
    verdicts = [verdict_in_log(line) for line in out.splitlines() if VERDICT_LINE in line]
    assert verdicts and all(v.status == "OOM" for v in verdicts), out[-3000:]
    evidence = verdicts[-1].evidence  # numpy's MemoryError, raised out of the step by TensorFlow as its own
    assert (evidence["kind"], evidence["rank"], evidence["step"]) == ("tf_resource_exhausted", 1, AT_STEP), evidence
    # Worker 0 (the records' writer; its flusher may not have written them all before it was stopped) never
    # got past the step: its all-reduce waited for worker 1.
    steps = [r["step"] for r in jobs.health(cfg) if r["type"] == "step"]
    assert all(step < AT_STEP for step in steps), steps
