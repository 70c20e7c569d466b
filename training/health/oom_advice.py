"""What to change after a rank ran out of memory: a pure function from the job's shape (and the memory the
rank had) to concrete changes, best first. Table-tested (tests/training/health/test_oom_advice.py).

A data-parallel rank holds the whole model, its gradients and optimizer state, and the activations of one
per-worker batch. Of these only the activations shrink without changing what is trained, so the first
advice keeps the global batch (batch_size x backward_passes_per_step x workers) and with it the learning
dynamics: a smaller per-worker batch, with more backward passes per all-reduce or more workers making up
the difference. The smaller batch is a divisor of the current one, so it still divides every partition's
rows (the preflight's rule). Only then the model itself, then the memory the rank is given.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..formats.config import JobConfig
from ..formats.engines import DEFAULT_ENGINE, engine_spec

MiB = 2**20


@dataclasses.dataclass(frozen=True)
class JobShape:
    """What the advice needs of the job: its per-worker batch, backward passes per all-reduce (under the
    engine's config key), workers and model. `JobShape.of(cfg, world_size)` from a job config."""

    batch_size: int
    backward_passes_per_step: int
    world_size: int
    engine: str = DEFAULT_ENGINE            # whose section holds backward_passes_per_step
    hidden: tuple[int, ...] | None = None   # the built-in MLP's hidden widths; None: a model.factory model
    # Whether the engine can add up backward passes before a step (its section has backward_passes_per_step;
    # TensorFlow's has none): else no advice to accumulate.
    accumulates: bool = True

    def __post_init__(self) -> None:
        for name in ("batch_size", "backward_passes_per_step", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"JobShape.{name} is {value!r}; use a whole number >= 1")

    @classmethod
    def of(cls, cfg: JobConfig, world_size: int, engine: str | None = None) -> "JobShape":
        """engine: the one the job runs with, where it overrides the config's (`ringflow train --engine`)."""
        engine = engine or cfg.engine
        passes = getattr(getattr(cfg, engine_spec(engine).config_section), "backward_passes_per_step", None)
        return cls(cfg.batch_size, passes or 1, world_size, engine,
                   tuple(cfg.model.hidden) if cfg.model.factory is None else None, accumulates=passes is not None)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.backward_passes_per_step * self.world_size


@dataclasses.dataclass(frozen=True)
class Advice:
    """One change: `option` (ACCUMULATE, MORE_WORKERS, SMALLER_MODEL, MORE_MEMORY), the config settings it
    means (`settings`, key -> new value; empty where no number can be computed) and its words."""

    option: str
    settings: Mapping[str, Any]
    words: str

    def to_dict(self) -> dict[str, Any]:
        return {"option": self.option, "settings": dict(self.settings), "words": self.words}


ACCUMULATE, MORE_WORKERS, SMALLER_MODEL, MORE_MEMORY = "accumulate", "more_workers", "smaller_model", "more_memory"


def smallest_factor(n: int) -> int:
    """The smallest prime factor of n >= 2."""
    f = 2
    while f * f <= n:
        if n % f == 0:
            return f
        f += 1
    return n


def advise(shape: JobShape | None, limit_bytes: int | None = None, limit_source: str | None = None) -> tuple[Advice, ...]:
    """The changes that make a rank fit, best first. shape None (the job's config is not known where the
    OOM was seen): the same options in words, without numbers. limit_bytes/limit_source: the memory the rank
    was given, if known (then the last option is to give it more)."""
    if shape is None:
        out = [Advice(ACCUMULATE, {}, "halve the per-worker batch size (batch_size) and double "
                                      "backward_passes_per_step (the global batch stays the same)"),
               Advice(SMALLER_MODEL, {}, "use a smaller model"),
               Advice(MORE_WORKERS, {}, "use twice the workers at half the batch_size (re-shard for them)")]
    else:
        out = []
        b, k, n = shape.batch_size, shape.backward_passes_per_step, shape.world_size
        if b > 1 and shape.accumulates:
            f = smallest_factor(b)
            key = f"{shape.engine}.backward_passes_per_step"
            out.append(Advice(ACCUMULATE, {"batch_size": b // f, key: k * f},
                              f"batch_size {b} -> {b // f} and {key} {k} -> {k * f} (the global batch stays "
                              f"{shape.global_batch}; each rank's activations are 1/{f} as large)"))
        out.append(_smaller_model(shape.hidden))
        if b > 1:
            f = smallest_factor(b)
            out.append(Advice(MORE_WORKERS, {"num_workers": n * f, "batch_size": b // f},
                              f"{n} -> {n * f} workers at batch_size {b // f} (the global batch stays "
                              f"{shape.global_batch}; re-shard for {n * f} workers)"))
    if limit_bytes is not None:
        out.append(Advice(MORE_MEMORY, {"memory_bytes": 2 * limit_bytes},
                          f"give each rank more memory than its {limit_bytes / MiB:.0f} MiB "
                          f"({limit_source or 'limit'}), e.g. {2 * limit_bytes / MiB:.0f} MiB"))
    return tuple(out)


def _smaller_model(hidden: tuple[int, ...] | None) -> Advice:
    if hidden and all(h > 1 for h in hidden):
        half = [max(1, h // 2) for h in hidden]
        return Advice(SMALLER_MODEL, {"model.hidden": half},
                      f"a smaller model: model.hidden {list(hidden)} -> {half}")
    return Advice(SMALLER_MODEL, {}, "a smaller model (fewer or narrower layers from model.factory)")
