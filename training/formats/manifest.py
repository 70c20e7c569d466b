"""The shard manifest: the contract between the sharding step (writer) and the training workers (readers).

Layout under a shard prefix:

    manifest.json            this document, written last
    part-00000.parquet       a partition file: whole minibatches only, in row groups of row_group_rows
    part-00001.parquet       ...
    eval.parquet             held-out evaluation split

`manifest.json` (format "ringflow.shards/v4"):

    {"format": "ringflow.shards/v4",
     "fingerprint": "<sha256 of the dataset's content fingerprint and the sharding parameters>",
     "source": {"uri": "...", "sha256": "<datasets.ContentHash of the whole table>", "rows": 1797},
     "params": {"num_partitions": 2, "batch_size": 32, "seed": 0, "eval_fraction": 0.2, "row_group_rows": 4096},
     "schema": {"features": ["f0", ...], "target": "target", "task": "classification", "num_classes": 10,
                "feature_mean": [...], "feature_std": [...],
                "columns": [{"name": "f0", "shape": [], "dtype": "float32"}, ...,
                            {"name": "target", "shape": [], "dtype": "int64"}]},
     "partitions": [{"index": 0, "key": "part-00000.parquet", "rows": 704, "minibatches": 22,
                     "sha256": "...", "size": 41234,
                     "row_groups": [{"offset": 4, "length": 40000, "rows": 704, "sha256": "..."}],
                     "footer": {"offset": 40004, "length": 1230, "sha256": "..."}}, ...],
     "eval": {"key": "eval.parquet", "rows": 389, "sha256": "...", "size": ..., "row_groups": [...], "footer": {...}},
     "remainder_rows": 5}

v4 makes partitions storage only: `num_partitions` files, however many workers train on them. An epoch is
one stream over the row groups of every file (rank/partition_batches.py), dealt to the workers by a global
cursor (rank/stream_deal.py), so a run checkpointed on N workers resumes on M. Every partition still holds
the same number of whole minibatches and the rows that do not fill them (`remainder_rows`) are moved to the
eval split rather than dropped: with as many workers as files, every rank then takes whole minibatches.

Only v4 is read. The formats before it (v1-v3: one partition per worker, the world size fixed at the
partition count; v1-v2 without the row-group index a rank streams by) came before ringflow's first release,
so no one holds them: a manifest of another format is refused (`ManifestError`), saying to re-shard.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

FORMAT = "ringflow.shards/v4"
MANIFEST_NAME = "manifest.json"
TASKS = ("classification", "regression")


class ManifestError(ValueError):
    """The manifest or one of its partitions is not usable; the message says what to fix."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class ByteRange:
    """Bytes [offset, offset + length) of a partition file, their sha256, and (a row group) its rows."""

    offset: int
    length: int
    sha256: str
    rows: int = 0

    def check(self, data: bytes, where: str) -> None:
        actual = sha256_hex(data)
        if len(data) != self.length or actual != self.sha256:
            raise ManifestError(
                f"{where} fails its checksum (manifest: {self.length} bytes, sha256 {self.sha256[:12]}…; read: "
                f"{len(data)} bytes, sha256 {actual[:12]}…): the shard was changed after sharding; re-run the "
                f"shard step")


@dataclasses.dataclass(frozen=True)
class PartitionEntry:
    """A partition file (or the eval split): its rows, its sha256, and its index (partition_index.py): the
    file's size and the byte ranges of its row groups and footer, by which a rank streams it."""

    key: str
    rows: int
    sha256: str
    size: int
    row_groups: tuple[ByteRange, ...]
    footer: ByteRange
    index: int = -1
    minibatches: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "row_groups",
                           tuple(g if isinstance(g, ByteRange) else ByteRange(**g) for g in self.row_groups))
        if isinstance(self.footer, dict):
            object.__setattr__(self, "footer", ByteRange(**self.footer))
        if not isinstance(self.footer, ByteRange):
            raise ManifestError(f"partition {self.key!r} has no footer range; re-run the shard step")

    def check(self, data: bytes) -> None:
        """Raise if `data` is not this partition's bytes (truncated, tampered, or a different file)."""
        actual = sha256_hex(data)
        if actual != self.sha256:
            raise ManifestError(
                f"partition {self.key!r} fails its checksum (manifest sha256 {self.sha256[:12]}…, "
                f"file {actual[:12]}…): the shard was changed after sharding; re-run the shard step"
            )


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    """One stored column: its name, the shape of one value (() for a scalar) and its element dtype."""

    name: str
    shape: tuple[int, ...] = ()
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if any(s < 1 for s in self.shape):
            raise ManifestError(f"column {self.name!r} has shape {list(self.shape)}; every size must be >= 1")

    @property
    def size(self) -> int:
        """Elements per value."""
        return math.prod(self.shape) if self.shape else 1


@dataclasses.dataclass(frozen=True)
class ShardSchema:
    features: tuple[str, ...]
    target: str
    task: str
    num_classes: int = 0
    # Mean and std of each feature over the training partitions, so every rank normalizes the same way.
    feature_mean: tuple[float, ...] = ()
    feature_std: tuple[float, ...] = ()
    # Features in order, then the target.
    columns: tuple[ColumnSpec, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        columns = tuple(c if isinstance(c, ColumnSpec) else ColumnSpec(**c) for c in self.columns)
        if [c.name for c in columns] != [*self.features, self.target]:
            raise ManifestError(f"schema.columns name {[c.name for c in columns]}; they must be the features, "
                                f"then the target")
        object.__setattr__(self, "columns", columns)
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

    @property
    def feature_columns(self) -> tuple[ColumnSpec, ...]:
        return self.columns[:-1]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example as a model receives it: a single tensor-valued feature keeps its shape
        (an image: (1, 8, 8)); otherwise the features, flattened, side by side."""
        features = self.feature_columns
        if len(features) == 1 and features[0].shape:
            return features[0].shape
        return (sum(c.size for c in features),)

    @property
    def num_features(self) -> int:
        """Numbers per example: the length of the flat feature vector (what an MLP takes)."""
        return sum(c.size for c in self.feature_columns)


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
    def training_rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    @property
    def batch_size(self) -> int:
        return int(self.params["batch_size"])

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    @property
    def minibatches_per_partition(self) -> int:
        return min(p.minibatches for p in self.partitions)

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
            raise ManifestError(f"manifest format is {doc.get('format') if isinstance(doc, dict) else None!r}, not "
                                f"{FORMAT!r}: re-shard the dataset with this ringflow (`ringflow shard` / the shard "
                                f"task)")
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


def split_manifest_uri(uri: str, s3=None):
    """(the store the manifest and its partitions live in, the manifest's key in it); an s3:// one opened
    with `s3` (S3Settings; None: the environment's)."""
    from ..store import open_store, split_uri

    parent, name = split_uri(uri)
    return open_store(parent, s3=s3), name


def load_manifest(uri: str, s3=None):
    """Read and check a manifest by URI; returns (manifest, the store its partitions live in). s3: as
    split_manifest_uri's."""
    store, name = split_manifest_uri(uri, s3)
    return ShardManifest.from_json(store.get_bytes(name)), store
