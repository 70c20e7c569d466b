"""Every rank's node, gathered once when the job starts: rank 0 writes them in the attempt's `start` record,
so a straggler verdict's rank can be named by its node (the operator's remedy keeps the next try off it)."""
from __future__ import annotations

import os

import torch

from .engine import Engine
from .worker_env import node_name

# Kubernetes node names are DNS subdomains of at most 253 characters; a hostname fits too.
MAX_NAME_BYTES = 253


def encode(name: str) -> torch.Tensor:
    """`name` as a fixed-width row of bytes (zero-padded), so every rank's row has the same shape."""
    raw = name.encode()[:MAX_NAME_BYTES]
    row = torch.zeros(1, MAX_NAME_BYTES, dtype=torch.uint8)
    row[0, :len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    return row


def decode(rows: torch.Tensor) -> list[str]:
    return [bytes(r.tolist()).rstrip(b"\0").decode(errors="replace") for r in rows]


def gather_node_names(engine: Engine) -> list[str]:
    """Rank i's node at index i. One small allgather at start-up, on every rank (a collective)."""
    mine = encode(node_name(os.environ))
    return decode(mine if engine.size == 1 else engine.allgather(mine, "ringflow.node_names"))
