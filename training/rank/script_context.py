"""What a user's script may ask about its place in the job (training/api.py's get_context). Torch-free."""
from __future__ import annotations

import dataclasses

from ..formats.config import JobConfig


@dataclasses.dataclass(frozen=True)
class Context:
    """What the script may ask about its place in the job (training/api.py's get_context)."""

    rank: int
    world_size: int
    local_rank: int
    device: str
    run_uri: str
    attempt: str
    engine: str
    config: JobConfig
    code_dir: str | None        # the unpacked bundle (None: code from the image)
    resumed_from: str | None    # the checkpoint this attempt resumed from
