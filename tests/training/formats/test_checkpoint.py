"""Checkpoints: round trip, pruning, and never resuming from a damaged or half-written checkpoint.

Runs against every store (`object_store` in tests/conftest.py): damage is done through the store
API, as a crashed writer or a bad copy would do it.
"""
from __future__ import annotations

import hashlib
import json
import logging

import pytest

from ringflow.training.formats.checkpoint import (FORMAT, CheckpointCorrupt, CheckpointManifest, CheckpointStore,
                                          CheckpointWarning, FileEntry, checkpoint_name)
from ringflow.training.store import ObjectNotFound


def state(step: int) -> dict[str, bytes]:
    return {"state.pt": f"weights@{step}".encode() * 100, "optim.pt": f"optim@{step}".encode()}


def test_save_load_round_trip(object_store):
    ckpts = CheckpointStore(object_store)
    name = ckpts.save(40, state(40), {"epoch": 2, "loss": 0.25})
    assert name == "ckpt-000000040"
    keys = [i.key for i in object_store.list()]
    assert keys == [f"checkpoints/{name}/{f}" for f in ("MANIFEST.json", "optim.pt", "state.pt")]

    doc = json.loads(object_store.get_bytes(f"checkpoints/{name}/MANIFEST.json"))
    assert doc["format"] == FORMAT and doc["step"] == 40 and doc["meta"] == {"epoch": 2, "loss": 0.25}
    data = state(40)["state.pt"]
    assert doc["files"]["state.pt"] == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    assert doc["created_at"].endswith("+00:00")

    loaded = ckpts.load(name)
    assert loaded.files == state(40) and loaded.step == 40
    manifest = loaded.manifest
    assert isinstance(manifest, CheckpointManifest) and manifest.name == name
    assert manifest.files["state.pt"] == FileEntry(hashlib.sha256(data).hexdigest(), len(data))
    assert manifest.key("state.pt") == f"checkpoints/{name}/state.pt"
    assert object_store.get_bytes(manifest.key("state.pt")) == data
    assert ckpts.verify(name) == manifest
    assert ckpts.read_manifest(name) == manifest
    assert ckpts.latest_valid().files == state(40)


def test_names_and_pruning_keep_last(object_store):
    ckpts = CheckpointStore(object_store, keep_last=2)
    assert ckpts.names() == [] and ckpts.latest_valid() is None
    for step in (5, 10, 1000, 20):  # out of order: names sort by step, not by save time
        ckpts.save(step, state(step), {})
    assert ckpts.names() == ["ckpt-000001000", "ckpt-000000020"]
    prefixes = {i.key.split("/")[1] for i in object_store.list("checkpoints/")}
    assert prefixes == {"ckpt-000001000", "ckpt-000000020"}  # pruned ones leave nothing behind


def test_prune_removes_stale_incomplete_but_not_newer_ones(object_store):
    ckpts = CheckpointStore(object_store, keep_last=3)
    object_store.put_bytes("checkpoints/ckpt-000000001/state.pt", b"crashed")  # older, incomplete
    object_store.put_bytes("checkpoints/ckpt-000000099/state.pt", b"in flight")  # newer: maybe saving
    object_store.put_bytes("checkpoints/not-a-checkpoint", b"left alone")
    ckpts.save(50, state(50), {})
    keys = {i.key for i in object_store.list()}
    assert not any("ckpt-000000001" in k for k in keys)
    assert "checkpoints/ckpt-000000099/state.pt" in keys
    assert "checkpoints/not-a-checkpoint" in keys
    assert ckpts.names() == ["ckpt-000000050"]


def test_saving_a_step_again_replaces_it(object_store):
    ckpts = CheckpointStore(object_store)
    ckpts.save(7, {"state.pt": b"first try", "extra.bin": b"x"}, {"try": 1})
    ckpts.save(7, {"state.pt": b"second try"}, {"try": 2})
    loaded = ckpts.load("ckpt-000000007")
    assert loaded.files == {"state.pt": b"second try"} and loaded.manifest.meta == {"try": 2}


def _latest_with_warning(ckpts: CheckpointStore, skipped: str):
    with pytest.warns(CheckpointWarning, match=skipped):
        return ckpts.latest_valid()


def test_latest_valid_skips_truncated_file(object_store):
    ckpts = CheckpointStore(object_store)
    ckpts.save(10, state(10), {})
    ckpts.save(20, state(20), {})
    key = "checkpoints/ckpt-000000020/state.pt"
    object_store.put_bytes(key, object_store.get_bytes(key)[:-7])
    loaded = _latest_with_warning(ckpts, r"ckpt-000000020.*'state.pt' has \d+ bytes")
    assert loaded.step == 10 and loaded.files == state(10)


def test_latest_valid_skips_tampered_file(object_store, caplog):
    ckpts = CheckpointStore(object_store)
    ckpts.save(10, state(10), {})
    ckpts.save(20, state(20), {})
    key = "checkpoints/ckpt-000000020/optim.pt"
    original = object_store.get_bytes(key)
    object_store.put_bytes(key, bytes([original[0] ^ 1]) + original[1:])  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger="ringflow.training.formats.checkpoint"):
        loaded = _latest_with_warning(ckpts, "ckpt-000000020.*'optim.pt' has sha256")
    assert loaded.step == 10
    assert "skipping checkpoint ckpt-000000020" in caplog.text


def test_latest_valid_skips_missing_file_and_bad_manifest(object_store):
    ckpts = CheckpointStore(object_store)
    ckpts.save(10, state(10), {})
    ckpts.save(20, state(20), {})
    ckpts.save(30, state(30), {})
    object_store.delete("checkpoints/ckpt-000000030/state.pt")
    object_store.put_bytes("checkpoints/ckpt-000000020/MANIFEST.json", b"{not json")
    with pytest.warns(CheckpointWarning) as record:
        assert ckpts.latest_valid().step == 10
    messages = [str(w.message) for w in record]
    assert any("ckpt-000000030" in m and "'state.pt' is missing" in m for m in messages)
    assert any("ckpt-000000020" in m and "not valid JSON" in m for m in messages)


def test_latest_valid_ignores_checkpoint_without_manifest(object_store, recwarn):
    ckpts = CheckpointStore(object_store)
    ckpts.save(10, state(10), {})
    # A worker killed mid-save: files of step 20 written, MANIFEST never.
    object_store.put_bytes("checkpoints/ckpt-000000020/state.pt", state(20)["state.pt"])
    assert ckpts.names() == ["ckpt-000000010"]
    assert ckpts.latest_valid().step == 10
    assert not [w for w in recwarn if issubclass(w.category, CheckpointWarning)]  # expected, not alarming
    with pytest.raises(ObjectNotFound, match="save did not finish"):
        ckpts.load("ckpt-000000020")


def test_latest_valid_none_when_all_corrupt(object_store):
    ckpts = CheckpointStore(object_store)
    ckpts.save(1, {"state.pt": b"abc"}, {})
    object_store.put_bytes("checkpoints/ckpt-000000001/state.pt", b"abd")
    with pytest.warns(CheckpointWarning):
        assert ckpts.latest_valid() is None


def test_load_and_verify_raise_checkpoint_corrupt(object_store):
    ckpts = CheckpointStore(object_store)
    name = ckpts.save(3, state(3), {})
    object_store.put_bytes(f"checkpoints/{name}/state.pt", b"short")
    for call in (ckpts.load, ckpts.verify):
        with pytest.raises(CheckpointCorrupt, match=r"ckpt-000000003: file 'state.pt' has 5 bytes, the manifest says \d+"):
            call(name)
    assert issubclass(CheckpointCorrupt, ValueError)


def test_manifest_for_another_step_is_corrupt(object_store):
    ckpts = CheckpointStore(object_store)
    ckpts.save(4, state(4), {})
    object_store.copy("checkpoints/ckpt-000000004/MANIFEST.json", "checkpoints/ckpt-000000005/MANIFEST.json")
    with pytest.raises(CheckpointCorrupt, match="says step 4"):
        ckpts.read_manifest("ckpt-000000005")


def test_custom_prefix_and_child_store(object_store):
    ckpts = CheckpointStore(object_store.child("run-9"), prefix="ckpt/train", keep_last=1)
    ckpts.save(1, {"s": b"1"}, {})
    ckpts.save(2, {"s": b"2"}, {})
    assert [i.key for i in object_store.list()] == [
        "run-9/ckpt/train/ckpt-000000002/MANIFEST.json", "run-9/ckpt/train/ckpt-000000002/s"]
    assert ckpts.read_manifest("ckpt-000000002").key("s") == "ckpt/train/ckpt-000000002/s"


@pytest.mark.parametrize("step, files, meta, error", [
    (-1, {"s": b""}, {}, ValueError),
    (True, {"s": b""}, {}, ValueError),
    (1, {}, {}, ValueError),
    (1, {"a/b": b""}, {}, ValueError),
    (1, {"MANIFEST.json": b""}, {}, ValueError),
    (1, {"..": b""}, {}, ValueError),
    (1, {"s": "not bytes"}, {}, TypeError),
    (1, {"s": b""}, {"x": object()}, TypeError),
])
def test_save_rejects_bad_input_before_writing(tmp_path, step, files, meta, error):
    from ringflow.training.store import LocalFolderStore

    store = LocalFolderStore(tmp_path)
    with pytest.raises(error):
        CheckpointStore(store).save(step, files, meta)
    assert list(store.list()) == []


@pytest.mark.job
def test_checkpoint_module_does_not_import_torch_or_airflow():
    import subprocess
    import sys

    code = ("import sys, ringflow.training.formats.checkpoint, ringflow.training.store; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'airflow')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_checkpoint_name():
    assert checkpoint_name(40) == "ckpt-000000040"
    with pytest.raises(ValueError):
        CheckpointStore(None, keep_last=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("written, wanted, engine", [
    ({"state.pt": b"torch"}, "model.npz", "tensorflow"),     # a torch engine's checkpoint, resumed by TensorFlow
    ({"model.npz": b"m", "optimizer.npz": b"o"}, "state.pt", "ddp"),  # and the other way round
])
def test_a_checkpoint_of_another_engine_is_refused_not_skipped(object_store, written, wanted, engine):
    from ringflow.training.formats.checkpoint import CheckpointOfAnotherEngine, require_file

    ckpts = CheckpointStore(object_store)
    ckpts.save(10, written, {})
    # It verifies: latest_valid returns it rather than skipping it as corrupt ...
    loaded = ckpts.latest_valid()
    assert loaded is not None and loaded.step == 10
    # ... and the rank that cannot read it says whose it is and what to do.
    with pytest.raises(CheckpointOfAnotherEngine, match=rf"not {wanted}: another engine wrote it .*engine "
                                                        rf"'{engine}' cannot resume it; resume with the engine"):
        ckpts.latest_valid(decode=lambda c: require_file(c, wanted, "run ckpt-000000010", engine))
    assert require_file(loaded, next(iter(written)), "here", engine) == next(iter(written.values()))
