"""The shard manifest: the contract between the sharding step (writer) and the training workers (readers).

Layout under a shard prefix:

    manifest.json            this document, written last
    part-00000.parquet       partition for rank 0: whole minibatches only
    part-00001.parquet       ...
    eval.parquet             held-out evaluation split

`manifest.json` (format "ringflow.shards/v1"):

    {"format": "ringflow.shards/v1",
     "fingerprint": "<sha256 of the dataset bytes and the sharding parameters>",
     "source": {"uri": "...", "sha256": "...", "rows": 1797},
     "params": {"num_partitions": 2, "batch_size": 32, "seed": 0, "eval_fraction": 0.2},
     "schema": {"features": ["f0", ...], "target": "target", "task": "classification", "num_classes": 10,
                "feature_mean": [...], "feature_std": [...]},
     "partitions": [{"index": 0, "key": "part-00000.parquet", "rows": 704, "minibatches": 22,
                     "sha256": "..."}, ...],
     "eval": {"key": "eval.parquet", "rows": 389, "sha256": "..."},
     "remainder_rows": 5}

Every partition holds the same number of whole minibatches, so every rank takes the same number of
synchronous steps per epoch (a rank with one batch more would wait forever in all-reduce). Training rows
that do not fill a whole minibatch on every partition (`remainder_rows`) are moved to the eval split
rather than dropped.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

FORMAT = "ringflow.shards/v1"
MANIFEST_NAME = "manifest.json"
TASKS = ("classification", "regression")


class ManifestError(ValueError):
    """The manifest or one of its partitions is not usable; the message says what to fix."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class PartitionEntry:
    key: str
    rows: int
    sha256: str
    index: int = -1
    minibatches: int = 0

    def check(self, data: bytes) -> None:
        """Raise if `data` is not this partition's bytes (truncated, tampered, or a different file)."""
        actual = sha256_hex(data)
        if actual != self.sha256:
            raise ManifestError(
                f"partition {self.key!r} fails its checksum (manifest sha256 {self.sha256[:12]}…, "
                f"file {actual[:12]}…): the shard was changed after sharding; re-run the shard step"
            )


@dataclasses.dataclass(frozen=True)
class ShardSchema:
    features: tuple[str, ...]
    target: str
    task: str
    num_classes: int = 0
    # Mean and std of each feature over the training partitions, so every rank normalizes the same way.
    feature_mean: tuple[float, ...] = ()
    feature_std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "feature_mean", tuple(self.feature_mean))
        object.__setattr__(self, "feature_std", tuple(self.feature_std))
        if self.task not in TASKS:
            raise ManifestError(f"schema.task is {self.task!r}; use one of {TASKS}")
        if self.task == "classification" and self.num_classes < 2:
            raise ManifestError("schema.num_classes must be >= 2 for classification")
        if not self.features:
            raise ManifestError("schema.features is empty: the dataset needs at least one feature column")

    @property
    def num_outputs(self) -> int:
        return self.num_classes if self.task == "classification" else 1


@dataclasses.dataclass(frozen=True)
class ShardManifest:
    fingerprint: str
    source: dict[str, Any]
    params: dict[str, Any]
    schema: ShardSchema
    partitions: tuple[PartitionEntry, ...]
    eval: PartitionEntry | None
    remainder_rows: int = 0

    @property
    def batch_size(self) -> int:
        return int(self.params["batch_size"])

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    @property
    def minibatches_per_partition(self) -> int:
        return min(p.minibatches for p in self.partitions)

    def partition_for_rank(self, rank: int, world_size: int) -> PartitionEntry:
        if world_size != self.num_partitions:
            raise ManifestError(
                f"the manifest has {self.num_partitions} partitions but the job runs {world_size} workers: "
                f"re-shard for {world_size} workers or set the worker count to {self.num_partitions}"
            )
        return self.partitions[rank]

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "source": self.source,
            "params": self.params,
            "schema": dataclasses.asdict(self.schema),
            "partitions": [dataclasses.asdict(p) for p in self.partitions],
            "eval": dataclasses.asdict(self.eval) if self.eval else None,
            "remainder_rows": self.remainder_rows,
        }
        return json.dumps(doc, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "ShardManifest":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"manifest is not valid JSON ({exc}); re-run the shard step") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ManifestError(f"manifest format is {doc.get('format') if isinstance(doc, dict) else None!r}, expected {FORMAT!r}")
        try:
            schema = doc["schema"]
            parts = tuple(PartitionEntry(**p) for p in doc["partitions"])
            manifest = cls(
                fingerprint=doc["fingerprint"],
                source=doc["source"],
                params=doc["params"],
                schema=ShardSchema(**schema),
                partitions=parts,
                eval=PartitionEntry(**doc["eval"]) if doc.get("eval") else None,
                remainder_rows=int(doc.get("remainder_rows", 0)),
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"manifest is missing or has a malformed field: {exc}") from exc
        if not manifest.partitions:
            raise ManifestError("manifest lists no partitions")
        if len({p.minibatches for p in manifest.partitions}) != 1:
            raise ManifestError("partitions hold different numbers of minibatches; re-run the shard step")
        return manifest


def load_manifest(uri: str):
    """Read and check a manifest by URI; returns (manifest, the store its partitions live in)."""
    from ringflow.training.store import open_store, split_uri

    parent, name = split_uri(uri)
    store = open_store(parent)
    return ShardManifest.from_json(store.get_bytes(name)), store
