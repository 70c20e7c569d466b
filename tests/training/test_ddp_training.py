"""2-process DDP runs on CPU under torchrun: the same training as Horovod's (the shared uninterrupted runs,
tests/training/conftest.py, DDP's started by the --engine flag), with accumulated passes too. (Kill-and-resume
equality, a DDP checkpoint resumed under Horovod: test_resume.py.)"""
import pytest
import torch

pytestmark = pytest.mark.job


def assert_same_parameters(actual, expected):
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7)


def test_ddp_trains_like_horovod_with_identical_replicas(jobs, uninterrupted):
    """Same partitions, order, scaled learning rate and averaging: the same parameters as Horovod's. The DDP run
    is `ringflow train --engine ddp` on a config that names no engine: the flag overrides the config's default,
    torchrun starts the ranks, DDP trains."""
    (ddp, out), (horovod, _) = uninterrupted("ddp"), uninterrupted("horovod")
    assert "engine" not in ddp
    steps = [r for r in jobs.health(ddp) if r["type"] == "step"]
    assert len(steps) == 3 * 22
    first, last = sum(s["loss"] for s in steps[:5]) / 5, sum(s["loss"] for s in steps[-5:]) / 5
    assert last < first / 3, (first, last)
    # The all-reduce time comes from the communication hook: measured on every rank, inside the step.
    assert all(0 < s < t for r in steps for s, t in zip(r["sync_time"], r["step_time"])), steps[:3]
    checksums = [r["checksums"] for r in jobs.health(ddp) if r["type"] == "checksum"]
    assert checksums and all(len(c) == 2 and c[0] == c[1] for c in checksums)
    assert [r["engine"] for r in jobs.health(ddp) if r["type"] == "start"] == ["ddp"]
    result = jobs.result(ddp)
    assert result.succeeded and result.world_size == 2
    assert result.samples_per_sec_after_warmup > 0  # both ranks' rows and times gathered after the closing barrier
    assert "step=10 epoch=1/3 loss=" in out and "on 2 workers with ddp (lr 0.004 = 0.002 x 2)" in out

    assert_same_parameters(jobs.final_parameters(ddp), jobs.final_parameters(horovod))


def test_accumulated_passes_match_horovods(jobs):
    """Two backward passes per step: DDP runs the first under no_sync, Horovod's optimizer holds its
    all-reduce back; either way one averaged step per two minibatches, the same parameters."""
    runs = {}
    for engine in ("ddp", "horovod"):
        cfg = jobs.config(f"accumulate-{engine}", epochs=1, engine=engine,
                          **{engine: {"backward_passes_per_step": 2}})
        code, out = jobs.run(cfg)
        assert code == 0, out
        assert jobs.result(cfg).step == 11  # 22 minibatches per epoch
        runs[engine] = jobs.final_parameters(cfg)
    assert_same_parameters(runs["ddp"], runs["horovod"])
