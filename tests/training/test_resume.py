"""Kill-and-resume equality: 2-process runs on CPU, rank 1 SIGKILLed at step 37, resumed from the step-30
checkpoint (model, optimizer, data cursor) to exactly the parameters of a run that was never interrupted. Under
Horovod here; DDP's kill and resume is test_ddp_training.py's (killed under DDP, resumed under Horovod, equal to
an uninterrupted DDP run) and test_elastic_resume.py's (every row once over 2 -> 3 -> 1 workers).

The interrupted run's tries use Horovod's MPI controller, the reference its Gloo one (the shared plain run): equal
parameters, identical replicas and a full result show the MPI controller trains as Gloo does (the learning itself,
on the Gloo run: test_horovod_training.py)."""
import pytest
import torch

pytestmark = pytest.mark.job


# TensorFlow's resume is tested with its rank.
@pytest.mark.parametrize("engine", ["horovod"])
def test_killed_worker_resumes_to_the_same_parameters(jobs, uninterrupted, engine):
    reference, _ = uninterrupted(engine)  # the shared plain run (tests/training/conftest.py)

    interrupted = jobs.config("interrupted", epochs=3, engine=engine, faults=[{"kind": "crash", "rank": 1, "step": 37}])
    code, out = jobs.run(interrupted, controller="mpi")
    assert code != 0 and "SIGKILL at step 37" in out
    del interrupted["faults"]
    code, out = jobs.run(interrupted, controller="mpi")
    assert code == 0, out
    checksums = [r["checksums"] for r in jobs.health(interrupted) if r["type"] == "checksum"]
    assert checksums and all(len(c) == 2 and c[0] == c[1] for c in checksums)
    result = jobs.result(interrupted)
    assert result.succeeded and result.world_size == 2 and result.step == 66
    assert result.samples_per_sec_after_warmup > 0 and "samples/s=" in out
    # The newest checkpoint published before the kill: 30, or 20 when 30's background upload was not through
    # (a kill mid-upload loses only the checkpoint in flight).
    resumed = jobs.result(interrupted).resumed_from
    assert resumed in ("ckpt-000000030", "ckpt-000000020") and f"resuming from checkpoint {resumed}" in out
    assert [r["engine"] for r in jobs.health(interrupted) if r["type"] == "start"][-1] == engine

    expected, actual = jobs.final_parameters(reference), jobs.final_parameters(interrupted)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7)
