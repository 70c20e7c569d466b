"""result.json: how one attempt of a training job ended. Rank 0 writes it; every reader goes through here.

    {"format": "ringflow.result/v1", "status": "succeeded" | "failed", "attempt": "…",
     "step": 340, "epoch": 5, "loss": 0.12, "checkpoint": "ckpt-000000340" | null,
     "verdict": {"status": "HEALTHY", "reason": "…", "evidence": {…}} | null,
     "resumed_from": "ckpt-…" | null, "world_size": 2,
     "skipped_checkpoints": [{"name": "ckpt-…", "reason": "…"}],   # newer ones the resume passed over
     "samples_per_sec_after_warmup": 5100.0 | null, "health_monitor_share_after_warmup": 0.013 | null,
     "checkpoint_blocked_seconds": 0.4 | null,
     "world_size_changes": [{"from_world_size": 2, "to_world_size": 3, "accumulation_steps": 1, ...}],
     "remedies": [{"try": 2, "verdict": "NONFINITE", "remedy": "lower_learning_rate", "words": "…"}]}

`world_size_changes`: every resume of this run on another number of workers so far, oldest first
(rank/world_size_change.py: the accumulation and learning-rate factor each chose); empty when none.
`membership_changes`: an elastic job's changes of workers inside this attempt (rank/elastic.py), oldest first;
`elastic_commits`, `elastic_commit_seconds`: its commits on rank 0 and their time on the training thread.

`remedies`: what the operator's retries changed before this attempt (`remediation: "auto"`,
training/core/remediation.py), oldest first, as the ranks got it in their config: the result says what
changed (the promotion gate can refuse a remediated model).

`checkpoint_blocked_seconds`: rank 0's training thread's time in checkpoints (snapshots, and waits for a
previous upload still running; checkpoint_writer.py); the uploads themselves run in the background.

It is the job's outcome as the job itself decided it: the launcher turns it into the process's exit status
(`exit_code`), the Airflow trigger hands it to the operator in its event, and evaluate and promote read the
final checkpoint and verdict from it. A retried task reuses the run folder, so a reader that knows which
attempt it watches (worker_env.ATTEMPT_ENV) takes only that attempt's result (`RunFolder.read_result(attempt)`).
Torch-free and Airflow-free: both sides import it. NaN/Inf are written as strings, as in health.jsonl.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from . import exit_codes
from .checkpoint import SkippedCheckpoint
from .config import RowRef
from ..health.verdict import Verdict
from .run_layout import RESULT

FORMAT = "ringflow.result/v1"
SUCCEEDED, FAILED = "succeeded", "failed"
STATUSES = (SUCCEEDED, FAILED)


class ResultError(ValueError):
    """result.json is not a result this ringflow can read."""


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, Mapping):
        return {str(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _float(value: Any) -> float | None:
    return None if value is None else float(value)  # "nan"/"inf" as written by _strict


@dataclasses.dataclass(frozen=True)
class RunResult:
    status: str
    attempt: str  # the launch's attempt id (worker_env.ATTEMPT_ENV)
    step: int
    epoch: int
    world_size: int
    checkpoint: str | None = None
    verdict: Verdict | None = None
    loss: float = math.nan
    resumed_from: str | None = None
    samples_per_sec_after_warmup: float | None = None
    health_monitor_share_after_warmup: float | None = None
    checkpoint_blocked_seconds: float | None = None
    # Newer checkpoints the resume passed over (corrupt, unsafe), and why: the step it went back to is explained.
    skipped_checkpoints: tuple[SkippedCheckpoint, ...] = ()
    # Each resume on another number of workers (world_size_change.WorldSizeChange.as_record), oldest first.
    world_size_changes: tuple[dict[str, Any], ...] = ()
    # The remedies applied before this attempt (JobConfig.remedies), oldest first; () when none.
    remedies: tuple[Mapping[str, Any], ...] = ()
    # The rows the reader never served (the config's skip_rows), each once an epoch.
    skipped_rows: tuple[RowRef, ...] = ()
    # A failed result published before the replay of its NONFINITE step (rank/replay.py): the verdict is safe
    # if the replay is cut short, and the job is still at work (for at most health.replay_seconds and a
    # grace): the result that follows carries the replay's evidence, and this is False in it.
    replaying: bool = False
    # A user's script run (the job config's entry.script; None: ringflow's own loop), and the metrics of its
    # last report() (training/api.py).
    script: str | None = None
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # Each time the workers of an elastic job changed without a retry (rank/elastic.py's Membership), oldest
    # first: who left or joined, the world sizes, the commit the survivors went back to, the steps redone and
    # how long the recovery took.
    membership_changes: tuple[dict[str, Any], ...] = ()
    # An elastic job's commits on rank 0 (rank/elastic.py): how many, and its training thread's time in them (the
    # state's copy and the check for changed hosts); None when the job is not elastic.
    elastic_commits: int | None = None
    elastic_commit_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ResultError(f"result status {self.status!r}: use one of {STATUSES}")
        if self.status == SUCCEEDED and not self.checkpoint and self.script is None:
            # A script may hand ringflow no checkpoint at all (its own data, no training API calls).
            raise ResultError("a succeeded result names its final checkpoint; got none")
        if self.status == FAILED and self.checkpoint is not None:
            raise ResultError(f"a failed result has no final checkpoint; got {self.checkpoint!r}")
        if not isinstance(self.attempt, str) or not self.attempt:
            raise ResultError(f"result attempt {self.attempt!r}: use the launch's attempt id (a non-empty string)")
        for name in ("step", "epoch", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "world_size" else 0):
                raise ResultError(f"result {name} is {value!r}; use a whole number >= "
                                  f"{1 if name == 'world_size' else 0}")
        if self.verdict is not None and not isinstance(self.verdict, Verdict):
            raise ResultError(f"result verdict is a {type(self.verdict).__name__}; use a health Verdict")

    @property
    def remediated(self) -> bool:
        """Whether a remedy changed the training before this attempt (the gate's "no remediation")."""
        return bool(self.remedies)

    @property
    def succeeded(self) -> bool:
        return self.status == SUCCEEDED

    @property
    def exit_code(self) -> int:
        """The job's exit status for this result: 0, the verdict's code (exit_codes.BY_VERDICT), or 1."""
        if self.succeeded:
            return exit_codes.OK
        return exit_codes.for_verdict(self.verdict.status if self.verdict else None)

    def is_of(self, attempt: str | None) -> bool:
        """Whether this is the result of `attempt` (None: whichever attempt wrote last)."""
        return attempt is None or self.attempt == attempt

    def to_dict(self) -> dict[str, Any]:
        doc = {"format": FORMAT} | {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        doc["verdict"] = self.verdict.to_dict() if self.verdict else None
        doc["skipped_checkpoints"] = [dataclasses.asdict(s) for s in self.skipped_checkpoints]
        doc["world_size_changes"] = [dict(c) for c in self.world_size_changes]
        doc["membership_changes"] = [dict(c) for c in self.membership_changes]
        doc["remedies"] = [dict(r) for r in self.remedies]
        doc["skipped_rows"] = [dataclasses.asdict(r) for r in self.skipped_rows]
        doc["metrics"] = dict(self.metrics)
        return json.loads(json.dumps(_strict(doc), default=str))  # plain JSON: evidence may hold tuples

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False).encode()

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = RESULT) -> "RunResult":
        if not isinstance(doc, Mapping):
            raise ResultError(f"{where} holds a {type(doc).__name__}, not a ringflow result")
        fmt = doc.get("format")
        if fmt is None:  # written before results were versioned, by a ringflow from before the first release
            raise ResultError(f"{where} has no format: an earlier ringflow wrote it; start a new run (a new run_uri) "
                              f"and retrain")
        if fmt != FORMAT:
            raise ResultError(f"{where} is format {fmt!r}, not {FORMAT!r}: read it with the ringflow that wrote it")
        try:
            verdict = Verdict.from_dict(doc.get("verdict"))
            return cls(status=doc["status"], attempt=doc["attempt"], step=int(doc["step"]),
                       epoch=int(doc["epoch"]), world_size=int(doc["world_size"]), checkpoint=doc.get("checkpoint"),
                       verdict=verdict, loss=_float(doc.get("loss", math.nan)),
                       resumed_from=doc.get("resumed_from"),
                       samples_per_sec_after_warmup=_float(doc.get("samples_per_sec_after_warmup")),
                       health_monitor_share_after_warmup=_float(doc.get("health_monitor_share_after_warmup")),
                       checkpoint_blocked_seconds=_float(doc.get("checkpoint_blocked_seconds")),
                       replaying=bool(doc.get("replaying", False)),
                       skipped_checkpoints=tuple(SkippedCheckpoint(str(s["name"]), str(s["reason"]))
                                                 for s in doc.get("skipped_checkpoints") or ()),
                       world_size_changes=tuple(dict(c) for c in doc.get("world_size_changes") or ()),
                       remedies=tuple(dict(r) for r in doc.get("remedies") or ()),
                       skipped_rows=tuple(RowRef(str(r["file"]), int(r["row"])) for r in doc.get("skipped_rows") or ()),
                       script=doc.get("script"), metrics=dict(doc.get("metrics") or {}),
                       membership_changes=tuple(dict(c) for c in doc.get("membership_changes") or ()),
                       elastic_commits=doc.get("elastic_commits"),
                       elastic_commit_seconds=_float(doc.get("elastic_commit_seconds")))
        except ResultError as exc:
            raise ResultError(f"{where}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultError(f"{where} is not a ringflow result ({exc!r}); rerun the train task") from None

    @classmethod
    def from_json(cls, raw: bytes | str, where: str = RESULT) -> "RunResult":
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise ResultError(f"{where} is not JSON ({exc}); rerun the train task") from None
        return cls.from_dict(doc, where)

