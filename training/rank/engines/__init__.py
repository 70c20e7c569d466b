"""The data-parallel engines behind engine.Engine, one file each, and the one choice between them.

Which module starts which engine is the engine table's (formats/engines.py: `rank_engine`). Torch-free, so
the launcher (and through it the Airflow side) can import the choice.
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Mapping

from ...formats.config import ConfigError, JobConfig, check_engine_fits
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
    # The config checked itself against its own engine, not the override: an override that cannot run it is
    # refused here, before the launch (preflight calls this too), not by every rank once started.
    check_engine_fits(cfg, name)
    return name


def start_engine(cfg: JobConfig, environ: Mapping[str, str] = os.environ) -> "Engine":
    """Start this rank's engine: the one its launcher was chosen for."""
    module_name, class_name = TABLE[engine_name(cfg, environ.get(ENGINE_ENV))].rank_engine.split(":")
    return getattr(importlib.import_module(module_name), class_name).start(cfg)
