"""The one preflight check of a job against its shards: a table of jobs, manifests and worker counts."""
import json

import pytest

from ringflow.training.formats.config import ConfigError, JobConfig
from ringflow.training.formats.manifest import PartitionEntry, ShardManifest, ShardSchema
from ringflow.training.core.preflight import check_job, preflight


V3, V4 = "ringflow.shards/v3", "ringflow.shards/v4"


def manifest(partitions: int = 2, minibatches: int = 10, batch_size: int = 32, format: str = V3) -> ShardManifest:
    rows = minibatches * batch_size
    return ShardManifest(
        fingerprint="f", source={"uri": "builtin:digits"},
        params={"num_partitions": partitions, "batch_size": batch_size, "seed": 0},
        schema=ShardSchema(features=("a", "b"), target="target", task="classification", num_classes=3),
        partitions=tuple(PartitionEntry(key=f"part-{i}.parquet", rows=rows, sha256="0" * 64, index=i,
                                        minibatches=minibatches) for i in range(partitions)),
        eval=None, format=format)


def job(**fields) -> JobConfig:
    return JobConfig.from_dict({"manifest_uri": "/s/manifest.json", "run_uri": "/r"} | fields)


CUSTOM = {"kind": "custom", "factory": "ringflow.training.rank.models:conv_net"}


@pytest.mark.parametrize("fields, shards, workers, field, says", [
    ({}, {}, 2, None, None),
    ({"batch_size": 16}, {}, 2, None, None),                  # divides the 320 rows of each partition
    ({"batch_size": 320}, {}, 2, None, None),                 # one step per epoch
    ({}, {"partitions": 1}, 1, None, None),
    ({"model": CUSTOM}, {}, 2, None, None),
    ({}, {}, 3, "manifest_uri", r"\(ringflow.shards/v3\) has 2 partitions but the job asks for 3 workers; run with 2 "
                                "workers, or shard again"),
    ({}, {"partitions": 4}, 2, "manifest_uri", "run with 4 workers, or shard again"),
    # A current manifest: any number of workers, as long as each gets a whole micro-batch of the 640 rows.
    ({}, {"format": V4}, 3, None, None),
    ({}, {"format": V4, "partitions": 4}, 1, None, None),
    ({"batch_size": 48}, {"format": V4}, 2, None, None),      # the runs' last micro-batches are partial
    ({"batch_size": 321}, {"format": V4}, 2, "batch_size",
     "2 workers x 321 rows exceeds the shards' 640 training rows.*use at most 320 rows per worker, or fewer workers"),
    ({"batch_size": 321}, {}, 2, "batch_size", "321 exceeds the 320 rows of each partition; use at most 320"),
    ({"batch_size": 48}, {}, 2, "batch_size", "48 does not divide the 320 rows.*use 32, the shards' batch size"),
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
    import dataclasses
    import hashlib

    written = manifest(format="ringflow.shards/v2")
    for p in written.partitions:  # shards whose bytes the manifest describes (a v2 entry: the file's sha256)
        (tmp_path / p.key).write_bytes(f"partition {p.index}".encode())
    written = dataclasses.replace(written, partitions=tuple(
        dataclasses.replace(p, sha256=hashlib.sha256((tmp_path / p.key).read_bytes()).hexdigest(),
                            size=(tmp_path / p.key).stat().st_size)
        for p in written.partitions))
    (tmp_path / "manifest.json").write_text(written.to_json())
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"manifest_uri": str(tmp_path / "manifest.json"), "run_uri": "/r"}))
    assert preflight(str(path), 2).batch_size == 32
    with pytest.raises(ConfigError, match="run with 2 workers, or shard again"):
        preflight(str(path), 3)
    (tmp_path / "part-1.parquet").write_bytes(b"partition X")  # changed after sharding, same size
    assert preflight(str(path), 2).batch_size == 32  # a v2 entry has no footer hash: the ranks find it
    with pytest.raises(ConfigError, match="shard 'part-1.parquet' fails its checksum.*re-run the shard step"):
        preflight(str(path), 2, verify_all_shard_bytes=True)
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
