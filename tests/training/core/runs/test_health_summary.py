"""The train task log's one-screen health summary: one row per kind of run it summarizes."""
import pytest

from ringflow.training.core.runs.health_summary import MAX_LINES, health_summary
from ringflow.training.formats.checkpoint import SkippedCheckpoint
from ringflow.training.formats.run_result import RunResult
from ringflow.training.health.oom import MemoryEvidence, oom_verdict
from ringflow.training.health.oom_advice import JobShape
from ringflow.training.health.verdict import Verdict

HEALTHY = Verdict("HEALTHY", "no sign of trouble", {"last_step": 40})


def step(n, attempt="t2", grad=1.0, compute=(0.01, 0.02), sync=(0.01, 0.005)):
    return {"type": "step", "attempt": attempt, "step": n, "epoch": 0, "grad_norm": grad, "loss": 0.5,
            "step_time": [c + s for c, s in zip(compute, sync)], "sync_time": list(sync),
            "compute_time": list(compute), "nonfinite_ranks": [], "samples_per_sec": 1000.0}


RUN = [
    {"type": "start", "attempt": "t1", "step": 0, "resumed_from": None},
    step(10, "t1", grad=9.0), {"type": "checkpoint", "attempt": "t1", "name": "ckpt-000000010", "step": 10},
    {"type": "start", "attempt": "t2", "step": 10, "resumed_from": "ckpt-000000010"},
    step(20, grad=0.5), step(30, grad=2.0, sync=(0.03, 0.02)), step(40, grad="nan"),
    {"type": "checkpoint", "attempt": "t2", "name": "ckpt-000000040", "step": 40, "final": True},
]


def result(status="succeeded", **more):
    fields = dict(status=status, attempt="t2", step=40, epoch=2, world_size=2, loss=0.25,
                  checkpoint="ckpt-000000040" if status == "succeeded" else None, verdict=HEALTHY,
                  resumed_from="ckpt-000000010", samples_per_sec_after_warmup=5100.0,
                  health_monitor_share_after_warmup=0.013, checkpoint_blocked_seconds=0.4)
    return RunResult(**(fields | more))


OOM = oom_verdict(MemoryEvidence("kernel_oom_killer", 1, 2, "the launcher", limit_bytes=256 * 2**20),
                  JobShape(32, 1, 2))

# An elastic job's changes of workers, as rank/elastic.py's Membership.as_record writes them.
LEFT = {"why": "left", "detail": "Horovod has been shut down", "from_world_size": 3, "to_world_size": 2,
        "commit_step": 10, "steps_redone": 2, "failed_at": 100.0, "resumed_at": 100.647, "rank0_changed": True,
        "recovery_seconds": 0.647}
JOINED = {"why": "joined", "detail": "Horovod's driver added hosts", "from_world_size": 2, "to_world_size": 3,
          "commit_step": 400, "steps_redone": 0, "failed_at": 103.9, "resumed_at": 110.093, "rank0_changed": False,
          "recovery_seconds": 6.193}

# (result, verdict, records, lines that must appear (substrings), lines that must not)
ROWS = {
    "a healthy resumed run": (
        result(), HEALTHY, RUN,
        ["verdict: HEALTHY: no sign of trouble", "succeeded at step 40, epoch 2, on 2 worker(s), loss 0.25",
         "5100 samples/s after warm-up; health monitor 1.3%", "steps measured: 3 (steps 20..40)",
         "sync share: max 62% (step 30)", "gradient norm: 0.5 .. 2 (1 non-finite)",
         "slowest rank: 1 in 3 of 3 steps; the slowest computed up to 2.00x",
         "checkpoints: 1 taken this attempt, final ckpt-000000040; training blocked 0.4s",
         "resumed from: ckpt-000000010 (step 10)"],
        ["OOM advice", "9", "workers changed"]),  # the first attempt's gradient norm (9) is not this one's
    "a NaN, failed": (
        result("failed", verdict=Verdict("NONFINITE", "NaN/Inf in rank(s) [1] at step 40", {"step": 40}),
               resumed_from=None, samples_per_sec_after_warmup=None),
        Verdict("NONFINITE", "NaN/Inf in rank(s) [1] at step 40", {"step": 40}), RUN,
        ["verdict: NONFINITE: NaN/Inf in rank(s) [1] at step 40", "failed at step 40",
         "checkpoints: 1 taken this attempt, last ckpt-000000040"],
        ["throughput", "final"]),
    "an OOM without a result: the advice": (
        None, OOM, [{"type": "start", "attempt": "t1", "step": 0}],
        ["verdict: OOM: rank 1 ran out of memory at step 2", "result: none written by this attempt",
         "steps measured: none", "OOM advice 1: batch_size 32 -> 16", "OOM advice 3: 2 -> 4 workers"],
        ["OOM advice 4", "resumed from"]),
    "records that could not be read": (
        result(), None, None,
        ["verdict: HEALTHY", "health records: could not be read"], ["steps measured"]),
    "nothing at all": (None, None, [], ["verdict: none recorded", "result: none written"], ["slowest rank"]),
    "one worker: no slowest rank": (
        result(world_size=1), HEALTHY,
        [{"type": "start", "attempt": "t2", "step": 0}, step(5, compute=(0.01,), sync=(0.0,))],
        ["steps measured: 1", "sync share: max 0%"], ["slowest rank"]),
    "an elastic job whose workers changed twice": (
        result(membership_changes=(LEFT, JOINED)), HEALTHY, RUN,
        ["workers changed 2x: 3→2 left (back to step 10, 2 redone, new rank 0, 0.65s); "
         "2→3 joined (back to step 400, 0 redone, 6.19s)"], []),
    "an elastic job still without a result: its records' changes": (
        None, HEALTHY, RUN + [{"type": "membership", "attempt": "t2", **LEFT}],
        ["workers changed 1x: 3→2 left (back to step 10, 2 redone, new rank 0, 0.65s)"], ["joined"]),
    "no commit yet, and many changes": (
        result(membership_changes=(LEFT | {"commit_step": None},) + (JOINED,) * 5), HEALTHY, RUN,
        ["workers changed 6x: 3→2 left (back to the run folder, 2 redone", "; +2 more"], []),
    "many resumes and skipped checkpoints": (
        result(skipped_checkpoints=(SkippedCheckpoint("ckpt-000000050", "corrupt"),)), HEALTHY,
        [{"type": "start", "attempt": f"t{i}", "step": 10 * i, "resumed_from": f"ckpt-{10 * i:09d}"}
         for i in range(1, 8)],
        ["(+3 earlier); 1 newer checkpoint(s) skipped"], []),
}


@pytest.mark.parametrize("name", ROWS)
def test_health_summary(name):
    res, verdict, records, present, absent = ROWS[name]
    lines = health_summary(res, verdict, records)
    text = "\n".join(lines)
    assert 2 < len(lines) <= MAX_LINES
    for part in present:
        assert part in text, f"{part!r} missing from:\n{text}"
    for part in absent:
        assert part not in text, f"{part!r} should not be in:\n{text}"


def test_a_long_reason_is_clipped_to_one_screen():
    long = Verdict("STALLED", "x" * 2000)
    line = next(l for l in health_summary(None, long, []) if l.startswith("verdict"))
    assert len(line) < 300 and line.endswith("…")


def test_the_summary_ends_with_what_the_retries_changed():
    applied = {"try": 2, "verdict": "NONFINITE", "remedy": "lower_learning_rate",
               "words": "NaN/Inf at step 10: learning_rate 0.01 -> 0.005"}
    lines = health_summary(result(remedies=(applied,)), None, RUN)
    assert lines[-1] == ("remediated: try 2: lower_learning_rate after NONFINITE: NaN/Inf at step 10: "
                         "learning_rate 0.01 -> 0.005")
    # the try's config says it where the try wrote no result
    assert health_summary(None, None, RUN, [applied])[-1].startswith("remediated: try 2")
    assert not any(line.startswith("remediated") for line in health_summary(result(), None, RUN))
