"""A verdict one rank reached alone, said in the job's log: its way to the launcher and the trigger.

A rank other than 0 writes nothing to the run folder (rank 0 holds the fence), and a rank that stops on a
finding of its own (it ran out of memory; the user's script reported a NaN/Inf loss on it alone) leaves its
peers failing in the collective it left, rank 0 among them, so no result.json says why the job ended. So the
rank prints its verdict as one line (`verdict_line`), which the launcher (core/launcher.py) and the trigger
(core/runs/health_watch.py) read back (`SaidVerdict`) from the log they read anyway, on every backend; the
launcher prints the verdict it ended a job on the same way, for whoever reads its own log.
"""
from __future__ import annotations

import json

from .verdict import NONFINITE, OOM, Verdict

VERDICT_LINE = "[ringflow] verdict: "
# The verdicts a rank reaches alone and says in the log; any other status in such a line is not read.
SAID_IN_LOG = (OOM, NONFINITE)
_JSON = json.JSONDecoder()


def verdict_line(verdict: Verdict) -> str:
    return VERDICT_LINE + json.dumps(verdict.to_dict(), sort_keys=True, default=str)


def verdict_in_log(line: str) -> Verdict | None:
    """The first verdict of one of SAID_IN_LOG in `line`: as printed, prefixed by a launcher's tag (mpirun's
    "[1,0]<stderr>:", torchrun's "[default1]:"), or run into another rank's output when both wrote at once (each
    VERDICT_LINE's JSON object is read on its own, whatever follows it on the line)."""
    at = line.find(VERDICT_LINE)
    while at >= 0:
        start = at + len(VERDICT_LINE)
        try:
            doc, _ = _JSON.raw_decode(line, start)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and doc.get("status") in SAID_IN_LOG:
            evidence = doc.get("evidence")
            return Verdict(doc["status"], str(doc.get("reason", "")), evidence if isinstance(evidence, dict) else {})
        at = line.find(VERDICT_LINE, start)
    return None


class SaidVerdict:
    """Fed a job's log lines, it keeps the first verdict a rank said (the one that ended the job: its peers'
    failures follow it)."""

    def __init__(self) -> None:
        self.verdict: Verdict | None = None

    def feed(self, line: str) -> None:
        if self.verdict is None:
            self.verdict = verdict_in_log(line)
