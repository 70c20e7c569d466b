"""A rank's replay of a non-finite step (rank/replay.py), and how rank 0 puts the ranks' replays into the
NONFINITE verdict's evidence. Torch-free and pure: table-tested (tests/training/formats/test_replay_report.py).

Each rank replays its own minibatch(es) of the step, so each says only whether its own part is non-finite
again. The step is reproducible (the data) when any rank's part is; it is not (a transient fault: hardware,
a race, an injected NaN) when every rank answered and none is. Anything short of that (a rank that sent no
report in time, one whose replay failed, an engine that cannot replay) decides nothing: the evidence then
has no `replay` but `replay_unavailable`, one line saying why, so the remediation policy treats the verdict
as it did before replays existed, and the verdict itself is never lost to a replay that went wrong.

    evidence["replay"] = {"reproducible": bool, "step": s, "checkpoint_step": c | None,
                          "rows": [{"file": <partition key>, "row": <row in that file>}, ...],
                          "reason": "<one line: data or transient>", "complete": bool, "seconds": t,
                          "ranks": {<rank>: {"nonfinite": bool, "tests": n, "seconds": t, ...}}}
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from .config import RowRef


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    rank: int
    step: int
    checkpoint_step: int | None   # the state replayed on: this checkpoint's, None: the initial weights
    nonfinite: bool | None        # this rank's minibatch(es) of the step non-finite again; None: undecided
    rows: tuple[RowRef, ...] = ()  # of them, the rows that are non-finite alone
    tests: int = 0                # forward and backward passes the row search ran
    complete: bool = True         # False: the row search stopped at its bound; more bad rows may remain
    seconds: float = 0.0
    error: str | None = None      # why this rank's replay decided nothing

    def to_json(self) -> bytes:
        doc = dataclasses.asdict(self)
        doc["rows"] = [dataclasses.asdict(r) for r in self.rows]
        return json.dumps(doc).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "ReplayReport":
        doc = json.loads(raw)
        return cls(**{**doc, "rows": tuple(RowRef(**r) for r in doc.get("rows") or ())})

    def summary(self) -> dict[str, Any]:
        """What the evidence keeps of this rank's replay (its rows are the evidence's `rows`)."""
        out: dict[str, Any] = {"nonfinite": self.nonfinite, "checkpoint_step": self.checkpoint_step,
                               "tests": self.tests, "seconds": round(self.seconds, 3)}
        if self.error:
            out["error"] = self.error
        return out


def step_to_replay(evidence: Mapping[str, Any], first_step: int, replay_seconds: float) -> int | str:
    """The step a NONFINITE verdict's replay replays, or why there is none (one line for `replay_unavailable`):
    replay off, a NaN/Inf found in the parameters (a checksum, a checkpoint's state: the step it began at is not
    known, and replaying the step it was found at would call it transient), or a step this attempt (which
    started after `first_step`) did not train."""
    step = evidence.get("step")
    if not replay_seconds:
        return "replay is off (health.replay_seconds is 0)"
    if "detected_at_step" not in evidence:
        return ("replay: the step where the NaN/Inf began is not known (it was found in the parameters, not in a "
                "step's loss or gradient)")
    if not isinstance(step, int) or isinstance(step, bool) or step <= first_step:
        return f"replay: step {step!r} is not one this attempt trained (it started after step {first_step})"
    return step


def replay_evidence(step: int, world_size: int, reports: Sequence[ReplayReport],
                    waited_seconds: float) -> dict[str, Any]:
    """What the NONFINITE verdict's evidence gains from the ranks' `reports` (those that arrived within
    `waited_seconds`): {"replay": {...}} when they decide, else {"replay_unavailable": "<why>"}."""
    by_rank = {r.rank: r for r in reports if r.step == step}
    bad = [r for r in by_rank.values() if r.nonfinite]
    missing = [rank for rank in range(world_size) if rank not in by_rank]
    undecided = [r for r in by_rank.values() if r.nonfinite is None]
    if not bad and (missing or undecided):
        why = [f"rank(s) {missing} sent no report within {waited_seconds:.0f}s"] if missing else []
        why += [f"rank {r.rank}: {r.error}" for r in sorted(undecided, key=lambda r: r.rank)]
        return {"replay_unavailable": f"replay of step {step} decided nothing: " + "; ".join(why)}
    # Every rank reads the same published checkpoints; the first deciding rank's is the one named.
    decided = [by_rank[rank] for rank in sorted(by_rank) if by_rank[rank].nonfinite is not None]
    rows = [dataclasses.asdict(row) for r in sorted(bad, key=lambda r: r.rank) for row in r.rows]
    complete = all(r.complete for r in bad)
    if bad:
        ranks = sorted(r.rank for r in bad)
        listed = ", ".join(f"{x['file']}#{x['row']}" for x in rows[:5])
        named = (f"rows {listed}{' and more' if len(rows) > 5 else ''}" if rows
                 else "no single row alone: the minibatch as a whole")
        reason = (f"data: step {step} is non-finite again on replay on rank(s) {ranks} ({named}); skip those "
                  "rows (skip_rows) or fix them in the dataset")
    else:
        reason = (f"transient: step {step} replayed finite on every rank; the NaN/Inf came from a fault "
                  "(hardware, a race), not from the data: a plain retry")
    return {"replay": {"reproducible": bool(bad), "step": step,
                       "checkpoint_step": decided[0].checkpoint_step,
                       "rows": rows, "reason": reason, "complete": complete,
                       # What the replay added on rank 0, from the verdict to the ranks' reports gathered.
                       "seconds": round(waited_seconds, 2),
                       "ranks": {str(rank): by_rank[rank].summary() for rank in sorted(by_rank)},
                       **({"ranks_unanswered": missing} if missing else {})}}
