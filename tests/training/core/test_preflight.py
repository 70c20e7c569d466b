"""The one preflight check of a job against its shards: a table of jobs, manifests and worker counts."""
import hashlib
import json

import pytest

from ringflow.training.formats.config import ConfigError, JobConfig
from ringflow.training.formats.manifest import ByteRange, ColumnSpec, PartitionEntry, ShardManifest, ShardSchema
from ringflow.training.core.preflight import check_job, preflight


def indexed_entry(index: int, rows: int, minibatches: int, data: bytes = b"partition") -> PartitionEntry:
    """Partition `index`, its file `data`: all but the last 4 bytes one row group, those 4 its footer."""
    def byte_range(offset: int, length: int, group_rows: int = 0) -> ByteRange:
        return ByteRange(offset, length, hashlib.sha256(data[offset:offset + length]).hexdigest(), group_rows)

    return PartitionEntry(key=f"part-{index}.parquet", rows=rows, sha256=hashlib.sha256(data).hexdigest(),
                          size=len(data), row_groups=(byte_range(0, len(data) - 4, rows),),
                          footer=byte_range(len(data) - 4, 4), index=index, minibatches=minibatches)


def manifest(partitions: int = 2, minibatches: int = 10, batch_size: int = 32, files: tuple[bytes, ...] = ()):
    rows = minibatches * batch_size
    return ShardManifest(
        fingerprint="f", source={"uri": "builtin:digits"},
        params={"num_partitions": partitions, "batch_size": batch_size, "seed": 0},
        schema=ShardSchema(features=("a", "b"), target="target", task="classification", num_classes=3,
                           columns=(ColumnSpec("a"), ColumnSpec("b"), ColumnSpec("target", (), "int64"))),
        partitions=tuple(indexed_entry(i, rows, minibatches, *files[i:i + 1]) for i in range(partitions)),
        eval=None)


def job(**fields) -> JobConfig:
    return JobConfig.from_dict({"manifest_uri": "/s/manifest.json", "run_uri": "/r"} | fields)


CUSTOM = {"kind": "custom", "factory": "ringflow.training.rank.models:conv_net"}


@pytest.mark.parametrize("fields, shards, workers, field, says", [
    ({}, {}, 2, None, None),
    ({"batch_size": 16}, {}, 2, None, None),                  # divides the 320 rows of each partition
    ({"batch_size": 320}, {}, 2, None, None),                 # one step per epoch
    ({}, {"partitions": 1}, 1, None, None),
    ({"model": CUSTOM}, {}, 2, None, None),
    # Any number of workers, as long as each gets a whole micro-batch of the 640 rows.
    ({}, {}, 3, None, None),
    ({}, {"partitions": 4}, 1, None, None),
    ({"batch_size": 48}, {}, 2, None, None),      # the runs' last micro-batches are partial
    ({"batch_size": 321}, {}, 2, "batch_size",
     "2 workers x 321 rows exceeds the shards' 640 training rows.*use at most 320 rows per worker, or fewer workers"),
    ({"model": {"kind": "custom", "factory": "no_such_module_xyz:build"}}, {}, 2, "model.factory",
     "cannot be imported.*install the package on every worker"),
    ({"model": {"kind": "custom", "factory": "json:no_such_function"}}, {}, 2, "model.factory",
     "has no callable 'no_such_function'"),
])
def test_check_job(fields, shards, workers, field, says):
    cfg, shard_manifest = job(**fields), manifest(**shards)
    if field is None:
        check_job(cfg, shard_manifest, workers)
        return
    with pytest.raises(ConfigError, match=says) as err:
        check_job(cfg, shard_manifest, workers)
    assert err.value.field == field


def test_factory_check_can_be_left_to_the_job():
    """An MPIJob's code lives in its image: the Airflow worker cannot import it, the rank checks it."""
    cfg = job(model={"kind": "custom", "factory": "only_in_the_training_image:build"})
    check_job(cfg, manifest(), 2, check_factory=False)
    with pytest.raises(ConfigError):
        check_job(cfg, manifest(), 2)


def test_preflight_reads_the_config_and_the_manifest(tmp_path):
    files = (b"partition 0", b"partition 1")
    written = manifest(files=files)
    for p, data in zip(written.partitions, files):  # shards whose bytes the manifest describes
        (tmp_path / p.key).write_bytes(data)
    (tmp_path / "manifest.json").write_text(written.to_json())
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"manifest_uri": str(tmp_path / "manifest.json"), "run_uri": "/r"}))
    assert preflight(str(path), 2).batch_size == 32
    with pytest.raises(ConfigError, match="21 workers x 32 rows exceeds the shards' 640 training rows"):
        preflight(str(path), 21)
    (tmp_path / "part-1.parquet").write_bytes(b"Partition 1")  # a row group changed after sharding, same size
    assert preflight(str(path), 2).batch_size == 32  # the footer is the same: the ranks find it as they stream
    with pytest.raises(ConfigError, match="shard 'part-1.parquet' fails its checksum at bytes 0..7.*re-run the shard "
                                          "step"):
        preflight(str(path), 2, verify_all_shard_bytes=True)
    (tmp_path / "part-1.parquet").write_bytes(b"partition X")  # the footer changed: found by default
    with pytest.raises(ConfigError, match="shard 'part-1.parquet' fails its checksum at bytes 7..11"):
        preflight(str(path), 2)
    (tmp_path / "part-1.parquet").write_bytes(b"partition")  # truncated: its size alone shows it
    with pytest.raises(ConfigError, match="shard 'part-1.parquet' has 9 bytes, the manifest says 11"):
        preflight(str(path), 2)
    path.write_text(json.dumps({"manifest_uri": str(tmp_path / "missing.json"), "run_uri": "/r"}))
    with pytest.raises(ConfigError, match="does not exist; run the shard step first"):
        preflight(str(path), 2)


# A user's TensorFlow factory module, which imports what this (Airflow/torch) venv lacks.
TF_FACTORY_MODULE = "import tensorflow_only_in_the_tf_venv_xyz\n\ndef build(*args, **kwargs):\n    pass\n"


@pytest.mark.parametrize("engine, factory, says", [
    # The TF engine: the module is looked for, never imported, so one importing TensorFlow passes here...
    ("tensorflow", "user_tf_models:build", None),
    ("tensorflow", "ringflow.training.rank.models:conv_net", None),  # the twin's torch path, mapped by the rank
    ("tensorflow", "user_tf_models:no_such_function", None),  # the function: the rank checks it when it starts
    # ...and a module that is not there fails, saying why it was not imported.
    ("tensorflow", "no_such_module_xyz:build", "'no_such_module_xyz' is not installed here.*only the TF venv "
                                               "has.*install the package on every worker and where the job is checked"),
    ("tensorflow", "no_such_package_xyz.models:build", "'no_such_package_xyz.models' cannot be found.*"
                                                       "No module named 'no_such_package_xyz'"),
    # The torch engines import it: the same module fails, naming the import.
    ("horovod", "user_tf_models:build", "'user_tf_models' cannot be imported.*tensorflow_only_in_the_tf_venv_xyz"),
    ("ddp", "user_tf_models:build", "cannot be imported"),
    ("horovod", "ringflow.training.rank.models:conv_net", None),
])
def test_the_factory_check_per_engine(tmp_path, monkeypatch, engine, factory, says):
    (tmp_path / "user_tf_models.py").write_text(TF_FACTORY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = job(model={"kind": "custom", "factory": factory})
    if says is None:
        check_job(cfg, manifest(), 2, engine=engine)
        return
    with pytest.raises(ConfigError, match=says) as err:
        check_job(cfg, manifest(), 2, engine=engine)
    assert err.value.field == "model.factory"


def test_the_factory_check_follows_the_config_engine_unless_overridden(tmp_path, monkeypatch):
    """`ringflow train --engine` overrides the config's engine: the check is the engine's that will run."""
    (tmp_path / "user_tf_models.py").write_text(TF_FACTORY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    tf_job = job(engine="tensorflow", model={"kind": "custom", "factory": "user_tf_models:build"})
    check_job(tf_job, manifest(), 2)
    with pytest.raises(ConfigError, match="cannot be imported"):
        check_job(tf_job, manifest(), 2, engine="horovod")
