"""A rerun of a job that had already finished reports the same checkpoint and verdict (the promotion gate
refuses a `null` verdict), and writes no checkpoint again."""
import pytest

pytestmark = pytest.mark.job


def test_rerun_of_a_finished_job_keeps_its_verdict(jobs):
    cfg = jobs.config("finished", epochs=1)
    code, out = jobs.run(cfg)
    assert code == 0, out
    first = jobs.result(cfg)
    # HEALTHY, or DEGRADED (sync-bound) on a loaded host: this tiny model's step is mostly all-reduce.
    assert first.verdict is not None and first.verdict.status in ("HEALTHY", "DEGRADED"), first
    final = jobs.checkpoint_folder(cfg, first.checkpoint) / "MANIFEST.json"
    written = final.read_bytes()

    code, out = jobs.run(cfg)
    assert code == 0, out
    again = jobs.result(cfg)
    assert "already finished" in out
    assert again.succeeded and again.checkpoint == first.checkpoint
    assert again.verdict == first.verdict and again.attempt != first.attempt
    assert final.read_bytes() == written
    starts = [r for r in jobs.health(cfg) if r["type"] == "start"]
    assert len(starts) == 2 and starts[1]["finished_already"] and starts[1]["attempt"] == again.attempt
