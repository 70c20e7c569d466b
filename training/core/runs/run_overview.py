"""What the run page shows about one run folder, read once into a typed RunOverview: the verdict and its evidence,
the attempts, the checkpoints, the evaluation and the production models it compares with, what was remediated and
where the world size changed. No HTML here (operators/run_page.py renders it), no Airflow, no torch.

Reading never fails as a whole: a part that cannot be read (a broken result.json, an unreadable eval.json, a
registry the store refuses) becomes a line in `problems` and the rest is still shown, since a person opens this
page precisely when something went wrong.

`remedies` and `world_size_changes` are optional keys of result.json (written by the remediation on retry and the
world-size-independent resume); the verdict evidence's `replay` likewise. A result without them shows none.

An elastic job's changes of workers (rank/elastic.py's Membership) are read from the health records' `membership`
records, every attempt's, since a run still training has no result yet; when the records cannot be read or hold
none, from result.json's `membership_changes` (the attempt that published it).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from ...formats.checkpoint import step_of
from ...formats.eval_result import EvalResult, EvalResultError
from ...formats.run_folder import RunFolder, RunFolderError
from ...formats.run_result import ResultError, RunResult
from ...health.heartbeat import Heartbeat
from ...health.verdict import Verdict
from ...store.base import ObjectNotFound, ObjectStore
from ..registry.model_registry import ModelRegistry, Pointer, RegistryError
from .store_layout import MODELS

# A page lists the newest checkpoints and the production models first; beyond these it says how many more.
MAX_CHECKPOINTS = 20
MAX_MODELS = 10


@dataclasses.dataclass(frozen=True)
class CheckpointRow:
    name: str
    step: int | None
    bytes: int | None  # None: its manifest could not be read
    attempt: str  # the attempt folder that wrote it ("" in a folder of the older layout)


@dataclasses.dataclass(frozen=True)
class ProductionRow:
    """A model in production whose metrics share a name with this run's evaluation."""
    model: str
    pointer: Pointer

    def from_run(self, run_uri: str) -> bool:
        return self.pointer.run_uri.rstrip("/") == run_uri.rstrip("/")


@dataclasses.dataclass(frozen=True)
class MembershipRow:
    """One change of an elastic job's workers (a `membership` record, or an entry of result.json's
    `membership_changes`); a field the source lacks is None."""
    attempt: str | None
    why: str | None              # "left" or "joined"
    detail: str | None
    from_world_size: int | None
    to_world_size: int | None
    commit_step: int | None      # the step the workers went back to; None: no commit yet (the run folder's)
    steps_redone: int | None
    failed_at: float | None      # unix time the change was seen
    recovery_seconds: float | None
    rank0_changed: bool | None
    who: str | None = None       # "left: 127.0.1:0; joined: …" from the record's worker names; None: not recorded

    @classmethod
    def of(cls, doc: Mapping[str, Any], attempt: str | None = None) -> "MembershipRow":
        def typed(key: str, kind):
            """doc[key] if it is a `kind` (a bool is no number here), else None: unknown, never a wrong figure."""
            value = doc.get(key)
            return value if isinstance(value, kind) and isinstance(value, bool) == (kind is bool) else None

        recovery = typed("recovery_seconds", (int, float))
        if recovery is None and None not in (typed("resumed_at", (int, float)), typed("failed_at", (int, float))):
            recovery = doc["resumed_at"] - doc["failed_at"]
        names = {key: [n for n in doc.get(key) or () if isinstance(n, str)] if isinstance(doc.get(key), list) else []
                 for key in ("left", "joined")}
        who = "; ".join(f"{key}: {', '.join(found)}" for key, found in names.items() if found) or None
        return cls(attempt if attempt is not None else typed("attempt", str), typed("why", str), typed("detail", str),
                   typed("from_world_size", int), typed("to_world_size", int), typed("commit_step", int),
                   typed("steps_redone", int), typed("failed_at", (int, float)), recovery, typed("rank0_changed", bool),
                   who)


@dataclasses.dataclass(frozen=True)
class RunOverview:
    uri: str
    result: RunResult | None
    heartbeat: Heartbeat | None
    attempts: tuple[tuple[int, str | None], ...]  # (number, attempt id), oldest first
    checkpoints: tuple[CheckpointRow, ...]
    more_checkpoints: int
    evaluation: EvalResult | None
    production: tuple[ProductionRow, ...]
    remedies: tuple[Mapping[str, Any], ...]
    world_size_changes: tuple[Mapping[str, Any], ...]
    problems: tuple[str, ...]
    membership_changes: tuple[MembershipRow, ...] = ()

    @property
    def verdict(self) -> Verdict | None:
        return self.result.verdict if self.result is not None else None

    @property
    def replay(self) -> Mapping[str, Any] | None:
        replay = self.verdict.evidence.get("replay") if self.verdict is not None else None
        return replay if isinstance(replay, Mapping) else None


def _records(value: Any) -> tuple[Mapping[str, Any], ...]:
    """An optional list of objects from result.json; anything else reads as none (the key is optional)."""
    if not isinstance(value, list):
        return ()
    return tuple(v if isinstance(v, Mapping) else {"value": v} for v in value)


def _result(run: RunFolder, problems: list[str]) -> tuple[RunResult | None, dict[str, Any]]:
    """The published result and its whole document (for the optional keys RunResult may not carry)."""
    try:
        key = run.result_key()
    except RunFolderError:
        return None, {}  # already a problem: run.json
    if key is None:
        return None, {}
    try:
        raw = run.store.get_bytes(key)
        return RunResult.from_json(raw, run.uri_of(key)), json.loads(raw)
    except ObjectNotFound:
        return None, {}
    except ResultError as exc:
        problems.append(str(exc))
        return None, {}


def _checkpoints(run: RunFolder, problems: list[str]) -> tuple[tuple[CheckpointRow, ...], int]:
    published = run.checkpoints()
    names = published.names()
    rows = []
    for name in names[:MAX_CHECKPOINTS]:
        try:
            step: int | None = step_of(name)
        except ValueError:
            step = None
        try:
            manifest = published.read_manifest(name)
            size: int | None = sum(entry.size for entry in manifest.files.values())
            step, prefix = manifest.step, manifest.prefix
        except (ObjectNotFound, ValueError) as exc:
            problems.append(f"checkpoint {name}: its manifest cannot be read ({exc})")
            size, prefix = None, ""
        attempt = prefix.split("/")[1] if prefix.startswith("attempts/") else ""
        rows.append(CheckpointRow(name, step, size, attempt))
    return tuple(rows), max(0, len(names) - MAX_CHECKPOINTS)


def _evaluation(run: RunFolder, problems: list[str]) -> EvalResult | None:
    try:
        return run.read_eval()
    except EvalResultError as exc:
        problems.append(str(exc))
        return None


def _model_names(root: ObjectStore) -> list[str]:
    """Every model with a production pointer under the store's models/."""
    names = set()
    for info in root.list(MODELS + "/"):
        parts = info.key.split("/")
        if len(parts) == 3 and parts[2] == "production.json":
            names.add(parts[1])
    return sorted(names)


def _production(root: ObjectStore | None, run_uri: str, evaluation: EvalResult | None,
                problems: list[str]) -> tuple[ProductionRow, ...]:
    """The production models whose metrics share a name with the evaluation: the ones a gate would compare it
    with (the run's promote task names the model; the run folder does not, so every comparable one is shown)."""
    if root is None or evaluation is None:
        return ()
    registry = ModelRegistry(root, MODELS)
    rows = []
    try:
        for name in _model_names(root):
            pointer = registry.production(name)
            if pointer is not None and set(pointer.metrics) & set(evaluation.metrics):
                rows.append(ProductionRow(name, pointer))
    except (RegistryError, OSError) as exc:
        problems.append(f"the model registry in {root.uri} cannot be read ({exc})")
    # the run's own promotion first, then the newest
    rows.sort(key=lambda r: not r.from_run(run_uri))
    return tuple(rows[:MAX_MODELS])


def _membership(run: RunFolder, result: RunResult | None, problems: list[str]) -> tuple[MembershipRow, ...]:
    """The changes of workers the health records show (every attempt's), else those result.json lists."""
    try:
        rows = tuple(MembershipRow.of(r) for r in run.read_health() if r.get("type") == "membership")
    except (RunFolderError, ObjectNotFound, ValueError, OSError) as exc:
        problems.append(f"the health records cannot be read ({exc})")
        rows = ()
    if rows or result is None:
        return rows
    return tuple(MembershipRow.of(c, result.attempt) for c in result.membership_changes)


def read_overview(run: RunFolder, registry_root: ObjectStore | None = None) -> RunOverview:
    """Everything the run page shows about `run`; `registry_root`: the store whose models/ holds the registry
    (the store the run folder lies in), None to compare with no production model."""
    problems: list[str] = []
    try:
        pointer, _ = run.pointer()
        readable = True
    except RunFolderError as exc:
        problems.append(str(exc))
        pointer, readable = None, False
    attempts = tuple((a.number, a.id) for a in pointer.attempts) if pointer is not None else ()
    result, doc = _result(run, problems)
    heartbeat: Heartbeat | None = None
    checkpoints: tuple[CheckpointRow, ...] = ()
    more = 0
    if readable:  # a broken run.json hides where the attempts wrote
        try:
            heartbeat = run.read_heartbeat()
        except ValueError as exc:
            problems.append(f"heartbeat.json cannot be read ({exc})")
        checkpoints, more = _checkpoints(run, problems)
    membership = _membership(run, result, problems) if readable else ()
    evaluation = _evaluation(run, problems)
    return RunOverview(uri=run.uri, result=result, heartbeat=heartbeat, attempts=attempts, checkpoints=checkpoints,
                       more_checkpoints=more, evaluation=evaluation,
                       production=_production(registry_root, run.uri, evaluation, problems),
                       remedies=_records(doc.get("remedies")), world_size_changes=_records(doc.get("world_size_changes")),
                       membership_changes=membership, problems=tuple(problems))
