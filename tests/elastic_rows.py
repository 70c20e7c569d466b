"""What an elastic job's row logs say: every training row of every epoch trained on exactly once, less what each
round trained after the commit the next round went back to (rank/elastic.py; cfg `row_log_dir`)."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from ringflow.training.formats.manifest import ShardManifest


def kept_rows_by_epoch(row_log_dir: Path, changes: list[dict]) -> dict[int, list[tuple[int, int]]]:
    """(partition, row) of every row the row logs say was trained, by epoch, without the rows of steps a change
    of workers lost (change i ends round i; a step after its commit_step was redone by round i + 1)."""
    by_epoch = defaultdict(list)
    for path in Path(row_log_dir).glob("rows-*.jsonl"):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            lost = doc["round"] < len(changes) and doc["step"] > (changes[doc["round"]]["commit_step"] or 0)
            if not lost:
                by_epoch[doc["epoch"]] += [tuple(r) for r in doc["rows"]]
    return by_epoch


def assert_every_row_once(cfg: dict, changes: list[dict]) -> None:
    by_epoch = kept_rows_by_epoch(Path(cfg["row_log_dir"]), changes)
    manifest = ShardManifest.from_json(open(cfg["manifest_uri"]).read())
    every_row = sorted((f, r) for f, p in enumerate(manifest.partitions) for r in range(p.rows))
    assert sorted(by_epoch) == list(range(cfg["epochs"]))
    for epoch, rows in by_epoch.items():
        assert sorted(rows) == every_row, f"epoch {epoch}: {len(rows) - len(set(rows))} twice, " \
                                          f"{len(set(every_row) - set(rows))} never"
