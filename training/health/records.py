"""health.jsonl: the records rank 0 writes beside the checkpoints, and reading them back."""
from __future__ import annotations

import json
import math
import threading
import time
from typing import Any, Iterable

from ringflow.training.store.base import ObjectNotFound, ObjectStore

from ringflow.training.run_layout import HEALTH as HEALTH_KEY


def _strict(value: Any) -> Any:
    """NaN/Inf as strings: strict JSON readers (jq, the Airflow UI, Go) reject bare NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def record(kind: str, **fields: Any) -> dict[str, Any]:
    return _strict({"type": kind, "time": time.time(), **fields})


def parse(text: str | bytes) -> list[dict[str, Any]]:
    """Every complete line; a last line cut short by a concurrent write is ignored, not an error."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read_health(store: ObjectStore) -> list[dict[str, Any]]:
    try:
        return parse(store.get_bytes(HEALTH_KEY))
    except ObjectNotFound:
        return []


class HealthLog:
    """Accumulates records and rewrites the whole object on flush.

    Whole-object writes because S3 has no append; they are atomic, so a reader sees a consistent prefix.
    Flushes are rate-limited to every `flush_seconds` except when forced (end of run, fatal verdict).
    """

    def __init__(self, store: ObjectStore, flush_seconds: float = 1.0, enabled: bool = True):
        self._store = store
        self._flush_seconds = flush_seconds
        self._enabled = enabled
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._last_flush = 0.0
        self._dirty = False
        if enabled:  # a resumed run keeps the history of the attempts before it
            try:
                existing = store.get_bytes(HEALTH_KEY).decode("utf-8", errors="replace")
                self._lines = [line for line in existing.splitlines() if line.strip()]
            except ObjectNotFound:
                pass

    def append(self, rec: dict[str, Any], force_flush: bool = False) -> None:
        if not self._enabled:
            return
        with self._lock:
            self._lines.append(json.dumps(rec, sort_keys=True))
            self._dirty = True
        self.flush(force=force_flush)

    def flush(self, force: bool = False) -> None:
        if not self._enabled:
            return
        with self._lock:
            now = time.monotonic()
            if not self._dirty or (not force and now - self._last_flush < self._flush_seconds):
                return
            self._store.put_bytes(HEALTH_KEY, ("\n".join(self._lines) + "\n").encode())
            self._last_flush, self._dirty = now, False
