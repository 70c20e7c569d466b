"""health.jsonl: the records rank 0 writes beside the checkpoints, and reading them back.

A store has no append, so the log rewrites health.jsonl whole on each flush. To keep that write (and the
memory behind it) bounded on a long run, every `segment_lines` records or `segment_bytes` bytes, whichever
comes first, the current lines are sealed into health/<n>.jsonl and health.jsonl starts over. The byte
bound keeps the write small where records are large: a step record lists every rank's times, so at 64
ranks 2,000 of them would be ~10 MB rewritten every flush_seconds by rank 0's training thread. Each record
carries `seq`, its place in the run, so a reader that catches the switch half done drops the lines it sees
twice, and `attempt`, the launch that wrote it.
A sealed segment never changes: `HealthReader` reads each once and only the new lines of health.jsonl.
"""
from __future__ import annotations

import json
import math
import sys
import threading
import time
from typing import Any, Callable

from ..store.base import ObjectNotFound, ObjectStore

from ..formats.run_layout import HEALTH as HEALTH_KEY, HEALTH_SEGMENTS


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


def step_record(rows: list[list[float]], meta: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """The `step` record of one measured step, from every rank's [step_time, sync_time, loss,
    first_nonfinite_step (-1: none)] row in rank order and the step's meta (step, epoch, grad_norm): the
    one shape every engine's monitor writes (rank/monitor.py for torch, rank/tensorflow_worker.py)."""
    step_times = [r[0] for r in rows]
    sync_times = [r[1] for r in rows]
    losses = [r[2] for r in rows]
    return record(
        "step", step=meta["step"], epoch=meta["epoch"], step_time=step_times, sync_time=sync_times,
        compute_time=[max(t - s, 0.0) for t, s in zip(step_times, sync_times)],
        loss=sum(losses) / len(losses), grad_norm=meta["grad_norm"],
        nonfinite_ranks=[rank for rank, r in enumerate(rows) if r[3] >= 0],
        first_nonfinite_step=[int(r[3]) if r[3] >= 0 else None for r in rows],
        samples_per_sec=len(rows) * batch_size / max(max(step_times), 1e-9),
    )


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


def _segment_key(index: int) -> str:
    return f"{HEALTH_SEGMENTS}{index:06d}.jsonl"


def _segment_keys(store: ObjectStore) -> list[str]:
    return sorted(info.key for info in store.list(HEALTH_SEGMENTS) if info.key.endswith(".jsonl"))


def read_health_in(store: ObjectStore) -> list[dict[str, Any]]:
    """All of the records one health log holds, in order: the sealed segments, then health.jsonl."""
    # health.jsonl before the segment listing: a segment is sealed before health.jsonl starts over, so
    # whatever moment this read falls on, no record is missed (some may be seen twice, dropped by seq).
    try:
        current = parse(store.get_bytes(HEALTH_KEY))
    except ObjectNotFound:
        current = []
    records: list[dict[str, Any]] = []
    for key in _segment_keys(store):
        records += parse(store.get_bytes(key))
    sealed_up_to = _last_seq(records)
    return records + [r for r in current if not (isinstance(r.get("seq"), int) and r["seq"] <= sealed_up_to)]


class HealthReader:
    """A run's new records since the last poll, for a watcher: each sealed segment is read once, and of
    health.jsonl (bounded by the segment size) only the lines after the last seen `seq` are parsed, so a
    poll costs the same at 1 k records as at 1 M. Plain state (two numbers): rebuilt by reading once."""

    def __init__(self) -> None:
        self.next_segment = 0
        self.last_seq = -1

    def poll(self, store: ObjectStore) -> list[dict[str, Any]]:
        # health.jsonl first, then the segments: the order read_health_in explains.
        try:
            current = store.get_bytes(HEALTH_KEY)
        except ObjectNotFound:
            current = b""
        new: list[dict[str, Any]] = []
        while True:
            try:
                sealed = store.get_bytes(_segment_key(self.next_segment))
            except ObjectNotFound:
                break
            self.next_segment += 1
            new += self._newer(parse(sealed))
        return new + self._newer(self._tail(current))

    def _tail(self, text: bytes) -> list[dict[str, Any]]:
        """The records of `text` after last_seq, parsing from the end until a seen one."""
        out = []
        for line in reversed(text.decode("utf-8", errors="replace").splitlines()):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut short by a concurrent write
            if isinstance(rec.get("seq"), int) and rec["seq"] <= self.last_seq:
                break
            out.append(rec)
        return out[::-1]

    def _newer(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        fresh = [r for r in records if isinstance(r.get("seq"), int) and r["seq"] > self.last_seq]
        if fresh:
            self.last_seq = fresh[-1]["seq"]
        return fresh


def last_seq_in(store: ObjectStore) -> int | None:
    """The seq of the last record in `store`'s health log (health.jsonl, else the last sealed segment), or
    None when it holds none."""
    try:
        last = _last_seq(parse(store.get_bytes(HEALTH_KEY)))
    except ObjectNotFound:
        last = -1
    if last < 0:
        sealed = _segment_keys(store)
        if sealed:
            last = _last_seq(parse(store.get_bytes(sealed[-1])))
    return last if last >= 0 else None


def _last_seq(records: list[dict[str, Any]]) -> int:
    for rec in reversed(records):
        if isinstance(rec.get("seq"), int):
            return rec["seq"]
    return -1


# Where a segment is sealed at the latest: at 2 ranks ~600 step records (~20 s of a small model's training
# between rewrites of at most this much), at 64 ranks ~50.
SEGMENT_BYTES = 256 * 1024


class HealthLog:
    """Accumulates records and rewrites health.jsonl whole on flush, sealing a segment every
    `segment_lines` records or `segment_bytes` bytes.

    Whole-object writes because S3 has no append; they are atomic, so a reader sees a consistent prefix.
    Flushes are rate-limited to every `flush_seconds` except when forced (end of run, fatal verdict).
    Once `start_flushing()` runs, a thread of its own does the writing: `append` only adds to memory (a
    forced one wakes the thread), so the training thread never waits for the store to take its records.
    The store write happens outside the lock `append` takes, so a slow store never blocks an append.
    """

    def __init__(self, store: ObjectStore, flush_seconds: float = 1.0, enabled: bool = True,
                 segment_lines: int = 2_000, attempt: str | None = None, segment_bytes: int = SEGMENT_BYTES,
                 first_seq: int = 0, before_write: Callable[[], None] = lambda: None):
        """first_seq: the seq of this log's first record, when the records before it live elsewhere (the
        attempts before this one, run_folder.py), so seq keeps counting across a run's attempts.
        before_write: called before each write to the store (the run folder's fence check)."""
        self._before_write = before_write
        self._store = store
        self._attempt = attempt
        self._flush_seconds = flush_seconds
        self._enabled = enabled
        self._segment_lines = segment_lines
        self._segment_bytes = segment_bytes
        self._lines: list[str] = []
        # Of _lines as written, each line and its newline; json.dumps escapes non-ASCII, so one byte a character.
        self._bytes = 0
        self._lock = threading.Lock()        # the lines (append, and taking a flush's snapshot)
        self._write_lock = threading.Lock()  # one writer to the store at a time, in order
        self._close_lock = threading.Lock()
        self._last_flush = 0.0
        self._dirty = False
        self._segments = 0
        self._next_seq = 0
        self._flusher: threading.Thread | None = None
        self._wake = threading.Event()
        self._closing = False
        self._failures = 0
        if enabled:  # a resumed run keeps the history of the attempts before it
            try:
                existing = store.get_bytes(HEALTH_KEY).decode("utf-8", errors="replace")
                self._lines = [line for line in existing.splitlines() if line.strip()]
                self._bytes = sum(len(line) + 1 for line in self._lines)
            except ObjectNotFound:
                pass
            sealed = _segment_keys(store)
            self._segments = len(sealed)
            last = _last_seq(parse("\n".join(self._lines)))
            if last < 0 and sealed:
                last = _last_seq(parse(store.get_bytes(sealed[-1])))
            self._next_seq = max(last + 1, first_seq)

    def start_flushing(self) -> None:
        """From now on a background thread writes the records, every flush_seconds or when one is forced."""
        if not self._enabled or self._flusher is not None:
            return
        self._flusher = threading.Thread(target=self._flush_loop, name="ringflow-health-log", daemon=True)
        self._flusher.start()

    def close(self) -> None:
        """Stop the background thread and write what is left (blocks until the store took it). Safe from two
        threads at once (a rank's end and SIGTERM's last word): the second waits for the first."""
        with self._close_lock:
            if self._flusher is not None:
                self._closing = True
                self._wake.set()
                self._flusher.join()
                self._flusher = None
            self.flush(force=True)

    def _flush_loop(self) -> None:
        while not self._closing:
            forced = self._wake.wait(self._flush_seconds)
            self._wake.clear()
            try:
                self.flush(force=forced)
            except Exception as exc:  # noqa: BLE001 - kept in memory and written with the next flush
                self._failures += 1
                if self._failures in (1, 10, 100):
                    print(f"[ringflow] writing health records failed ({self._failures}x), kept for the next "
                          f"try: {exc!r}", file=sys.stderr, flush=True)

    def append(self, rec: dict[str, Any], force_flush: bool = False) -> None:
        if not self._enabled:
            return
        with self._lock:
            stamp = {"seq": self._next_seq} | ({"attempt": self._attempt} if self._attempt else {})
            line = json.dumps(rec | stamp, sort_keys=True)
            self._lines.append(line)
            self._bytes += len(line) + 1
            self._next_seq += 1
            self._dirty = True
        if self._flusher is not None:
            if force_flush:
                self._wake.set()
            return
        self.flush(force=force_flush)

    def flush_soon(self) -> None:
        """Write what there is now: on the log's own thread once it runs, else here."""
        if self._flusher is not None:
            self._wake.set()
        else:
            self.flush(force=True)

    def flush(self, force: bool = False) -> None:
        if not self._enabled:
            return
        with self._write_lock:
            with self._lock:
                now = time.monotonic()
                if not self._dirty or (not force and now - self._last_flush < self._flush_seconds):
                    return
                seal = None
                if len(self._lines) >= self._segment_lines or self._bytes >= self._segment_bytes:
                    seal = (self._segments, self._lines, self._bytes)
                    self._segments += 1
                    self._lines, self._bytes = [], 0
                current = ("\n".join(self._lines) + "\n").encode() if self._lines else b""
                self._last_flush, self._dirty = now, False
            sealed = False
            try:
                self._before_write()
                if seal is not None:
                    # Sealed first, then health.jsonl starts over: see read_health_in for why in this order.
                    self._store.put_bytes(_segment_key(seal[0]), ("\n".join(seal[1]) + "\n").encode())
                    sealed = True
                self._store.put_bytes(HEALTH_KEY, current)
            except BaseException:
                with self._lock:  # nothing is lost: the next flush writes it again
                    if seal is not None and not sealed:
                        self._segments -= 1
                        self._lines, self._bytes = seal[1] + self._lines, seal[2] + self._bytes
                    self._dirty = True
                raise
