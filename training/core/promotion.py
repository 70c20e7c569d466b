"""Promote an evaluated run's checkpoint to production through the registry, if the gate allows.

The one promotion step the Airflow operator and `ringflow promote` both run. A gate that says "no" is a normal
outcome (`PromotionOutcome.promoted` False, with the reason); a run that cannot be judged is RunNotReady.

Other promotions of the same model may run at the same time. The gate is checked once before copying anything
(a clearly worse run costs no copy), and again by the registry against the production pointer it is about to
replace, after every lost race for it: a run is never compared with a pointer that has since changed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .gate import Gate
from .registry.model_registry import ModelRegistry
from .run_reader import EvaluatedRun, RunNotReady, read_evaluated_run, run_folder_in
from ..store.base import ObjectStore


@dataclasses.dataclass(frozen=True)
class PromotionOutcome:
    """What a promotion did. `version`: the registry version holding the run's checkpoint (None when the gate
    refused before copying; set but not promoted when another promotion landed first and the gate then
    refused against it). `previous`: the version in production when the gate last decided."""

    run: EvaluatedRun
    metric: str
    promoted: bool
    reason: str
    previous: int | None
    version: int | None = None
    new_version: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.run.metrics[self.metric], "verdict": self.run.verdict,
                "checkpoint": self.run.result.checkpoint, "previous": self.previous, "version": self.version,
                "new_version": self.new_version, "promoted": self.promoted, "reason": self.reason}

    def refusal(self, name: str) -> str:
        """A refused promotion in words, for the log (and the error, with fail_on_gate)."""
        message = f"not promoting {self.run.result.checkpoint} of {self.run.uri} as model {name!r}: {self.reason}"
        if self.version is not None:
            message += f" (its files stay in the registry as version {self.version}, not in production)"
        return message


def promote_run(store: ObjectStore, store_uri: str, run_uri: str, name: str, gate: Gate) -> PromotionOutcome:
    """Promote `run_uri` (inside the registry's store `store_uri`) as model `name` if `gate` allows."""
    folder = run_folder_in(store, store_uri, run_uri)
    run = read_evaluated_run(folder)
    if gate.metric not in run.metrics:
        raise RunNotReady(f"{folder.eval_uri} has no metric {gate.metric!r} (metrics: {sorted(run.metrics)}); "
                          "set metric= to one it has")
    registry = ModelRegistry(store)
    production = registry.production(name)
    metrics = dict(run.metrics)
    previous = production.version if production else None
    # A first look, so a run that is clearly worse costs no copy. Not the decision: production may change
    # before this promotion lands, so the registry asks the gate again.
    reason = gate.check(run.verdict, metrics, production, run.result.remedies)
    if reason is not None:
        return PromotionOutcome(run, gate.metric, promoted=False, reason=reason, previous=previous)
    promotion = registry.promote(name, run_uri=run_uri, checkpoint=run.result.checkpoint, metrics=metrics,
                                 decide=lambda current: gate.check(run.verdict, metrics, current, run.result.remedies))
    return PromotionOutcome(run, gate.metric, promoted=promotion.promoted,
                            reason="passed the gate" if promotion.promoted else promotion.reason or "",
                            previous=promotion.previous, version=promotion.version, new_version=promotion.new_version)
