"""A verdict one rank reached alone, said in the job's log (health/verdict_line.py): the line carries it through
a launcher's tags, other lines and other verdicts carry none, and the first said is the one kept."""
import pytest

from ringflow.training.health.oom import MEMORY_ERROR, MemoryEvidence, oom_verdict
from ringflow.training.health.verdict import NONFINITE, Verdict
from ringflow.training.health.verdict_line import VERDICT_LINE, SaidVerdict, verdict_in_log, verdict_line

OOM_VERDICT = oom_verdict(MemoryEvidence(MEMORY_ERROR, 1, 12, "rank 1 itself", limit_bytes=2**29), None)
NAN_VERDICT = Verdict(NONFINITE, "the script reported a NaN/Inf loss at step 3 on rank 1: lower the learning rate",
                      {"step": 3, "ranks": [1], "loss": "nan"})


@pytest.mark.parametrize("verdict", [OOM_VERDICT, NAN_VERDICT], ids=["OOM", "NONFINITE"])
@pytest.mark.parametrize("prefix, suffix", [
    ("", ""), ("[1,1]<stderr>:", ""), ("[1,1]<stderr>:", "[1,1]<stderr>:"), ("[default1]:", ""),
    # two ranks writing at once: another's line runs into this one's, braces and all (seen with forked ranks)
    ("", '[ringflow] rank memory: {"pid": 28895, "rank": 0}'),
    ('[ringflow] rank memory: {"pid": 28895}', '[ringflow] rank memory: {"pid": 28896}'),
])
def test_the_log_line_carries_the_verdict(verdict, prefix, suffix):
    line = prefix + verdict_line(verdict) + suffix
    assert line.startswith(prefix + VERDICT_LINE)
    assert verdict_in_log(line) == verdict


@pytest.mark.parametrize("line", [
    "[ringflow] rank 1: health verdict OOM: rank 1 ran out",  # the words, not the line
    VERDICT_LINE + "{not json",
    VERDICT_LINE + '{"status": "STALLED", "reason": "a rank alone does not say this one"}',
    VERDICT_LINE + '["OOM"]',
    VERDICT_LINE + "{not json" + VERDICT_LINE + '{"status": "STALLED"}',
    "step=3 loss=0.2",
])
def test_other_lines_carry_none(line):
    assert verdict_in_log(line) is None


def test_the_first_verdict_said_is_kept():
    said = SaidVerdict()
    for line in ["[default0]:step 3", "[default1]:" + verdict_line(NAN_VERDICT), verdict_line(OOM_VERDICT)]:
        said.feed(line)
    assert said.verdict == NAN_VERDICT
