"""The data-parallel engines behind engine.Engine, one file each, and the one choice between them.

Which module starts which engine is the engine table's (formats/engines.py: `rank_engine`). Torch-free, so
the launcher (and through it the Airflow side) can import the choice.
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Mapping

from ...formats.config import ConfigError, JobConfig, check_local_sgd
from ...formats.engines import ENGINES, TABLE

if TYPE_CHECKING:
    from ..engine import Engine

# Set by `ringflow train --engine` for every rank: it overrides the config's `engine` for that launch, so
# the rank starts the engine its launcher (horovodrun or torchrun) was chosen for.
ENGINE_ENV = "RINGFLOW_ENGINE"


def engine_name(cfg: JobConfig, override: str | None = None) -> str:
    """The engine a launch uses: the override (`--engine`, or ENGINE_ENV in a rank) else the config's."""
    name = override or cfg.engine
    if name not in ENGINES:
        raise ConfigError("engine", f"is {name!r} (from --engine or ${ENGINE_ENV})",
                          f"use one of {ENGINES}")
    check_local_sgd(cfg.ddp, name, cfg.precision)  # the config allowed it for its own engine, not the override
    return name


def start_engine(cfg: JobConfig, environ: Mapping[str, str] = os.environ) -> "Engine":
    """Start this rank's engine: the one its launcher was chosen for."""
    module_name, class_name = TABLE[engine_name(cfg, environ.get(ENGINE_ENV))].rank_engine.split(":")
    return getattr(importlib.import_module(module_name), class_name).start(cfg)
