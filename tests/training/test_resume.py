"""Kill-and-resume equality: a 2-process run on CPU killed twice and resumed each time from its newest checkpoint
(model, optimizer, data cursor) ends with exactly the parameters of a run that was never interrupted (the shared
plain DDP run, tests/training/conftest.py, which equals Horovod's: test_ddp_training.py).

One run, three tries, across the torch engines and Horovod's controllers: try 1 under DDP (torchrun), rank 0
SIGKILLed at step 37; try 2 under Horovod with its MPI controller resumes from DDP's checkpoint, rank 1 SIGKILLed
at step 50; try 3, Horovod/MPI again, resumes from Horovod's own checkpoint to the end. So what DDP writes Horovod
resumes, what Horovod writes Horovod resumes, and the MPI controller trains as Gloo does (equal parameters,
identical replicas, a full result). DDP resuming its own checkpoints, on other numbers of workers too:
test_elastic_resume.py. TensorFlow's resume is tested with its rank."""
import pytest
import torch

pytestmark = pytest.mark.job


def newest_before_the_kill(out: str, at: int) -> str:
    """The checkpoint a try resumed from, as its output says: the newest one published before the previous try's
    kill at step `at` (a checkpoint every 10 steps), or the one before it when the newest's background upload was
    not through (a kill mid-upload loses only the checkpoint in flight)."""
    newest, before = (f"ckpt-{step:09d}" for step in (at // 10 * 10, at // 10 * 10 - 10))
    resumed = newest if f"resuming from checkpoint {newest} " in out else before
    assert f"resuming from checkpoint {resumed} (step {int(resumed[5:])}" in out, out[-3000:]
    return resumed


def test_killed_workers_resume_across_engines_to_the_same_parameters(jobs, uninterrupted):
    reference, _ = uninterrupted("ddp")

    run = jobs.config("interrupted", epochs=3, engine="ddp", faults=[{"kind": "crash", "rank": 0, "step": 37}])
    code, out = jobs.run(run)
    assert code != 0 and "SIGKILL at step 37" in out

    run |= {"engine": "horovod", "faults": [{"kind": "crash", "rank": 1, "step": 50}]}
    code, out = jobs.run(run, controller="mpi")
    assert code != 0 and "SIGKILL at step 50" in out
    if newest_before_the_kill(out, 37) == "ckpt-000000030":
        assert ("resuming from checkpoint ckpt-000000030 (step 30, epoch 1, 896 of 1408 rows of the epoch left)"
                in out), out[-3000:]

    del run["faults"]
    code, out = jobs.run(run, controller="mpi")
    assert code == 0, out
    result = jobs.result(run)
    assert result.resumed_from == newest_before_the_kill(out, 50)
    assert result.succeeded and result.world_size == 2 and result.step == 66
    assert result.samples_per_sec_after_warmup > 0 and "samples/s=" in out
    assert [r["engine"] for r in jobs.health(run) if r["type"] == "start"] == ["ddp", "horovod", "horovod"]
    checksums = [r["checksums"] for r in jobs.health(run) if r["type"] == "checksum"]
    assert checksums and all(len(c) == 2 and c[0] == c[1] for c in checksums)

    expected, actual = jobs.final_parameters(reference), jobs.final_parameters(run)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7)
