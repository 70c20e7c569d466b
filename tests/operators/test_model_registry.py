"""ModelRegistry against both stores (the `object_store` fixture: a local folder, and S3 on moto,
marked slow). Checkpoints are written with CheckpointStore.save directly: no torch needed."""
from __future__ import annotations

import collections
import json

import pytest

from ringflow.operators.model_registry import ModelRegistry, RegistryError, run_prefix_in
from ringflow.training.checkpoint import CheckpointCorrupt, CheckpointStore
from ringflow.training.store import LocalFolderStore, ObjectNotFound
from ringflow.training.store.base import join_key

RUN = "runs/run-1"


def save_checkpoint(store, step, run=RUN, payload=b"weights"):
    ckpts = CheckpointStore(store.child(run), keep_last=None)
    return ckpts.save(step, {"state.pt": payload + str(step).encode(), "optim.pt": b"optim-%d" % step},
                      {"epoch": step // 10})


@pytest.fixture
def registry(object_store):
    return ModelRegistry(object_store)


class Spy:
    """Records, per method, the full keys (store URI + key) that the store class was called with.
    Patched on the class, not the instance: `child()` copies instances, and the copies must be
    recorded too."""

    METHODS = ("get_bytes", "get_file", "put_bytes", "put_file", "copy")

    def __init__(self, monkeypatch, store):
        self.calls = collections.defaultdict(list)
        cls = type(store)
        for method in self.METHODS:
            original = getattr(cls, method)

            def wrapper(this, key, *args, _original=original, _method=method):
                full = [f"{this.uri}/{key}"] + ([f"{this.uri}/{args[0]}"] if _method == "copy" else [])
                self.calls[_method].append(full if _method == "copy" else full[0])
                return _original(this, key, *args)

            monkeypatch.setattr(cls, method, wrapper)


def test_first_promotion_copies_the_checkpoint_and_sets_the_pointer(registry, object_store):
    ckpt = save_checkpoint(object_store, 40)
    promotion = registry.promote("digits", run_prefix=RUN, checkpoint=ckpt, metrics={"accuracy": 0.9},
                                 source_run="s3://bucket/ml/runs/run-1")
    assert (promotion.version, promotion.new_version, promotion.previous) == (1, True, None)
    assert registry.versions("digits") == [1]
    assert object_store.get_bytes("models/digits/v1/state.pt") == b"weights40"
    assert object_store.get_bytes("models/digits/v1/optim.pt") == b"optim-40"

    pointer = json.loads(object_store.get_bytes("models/digits/production.json"))
    manifest = CheckpointStore(object_store.child(RUN)).read_manifest(ckpt)
    assert pointer["version"] == 1 and pointer["previous"] is None
    assert pointer["sha256"] == {f: e.sha256 for f, e in manifest.files.items()}
    assert pointer["checkpoint"] == ckpt and pointer["metrics"] == {"accuracy": 0.9}
    assert pointer["source_run"] == "s3://bucket/ml/runs/run-1" and pointer["promoted_at"]

    model = registry.model_info("digits", 1)
    assert model["source"]["keys"]["state.pt"] == f"{RUN}/checkpoints/{ckpt}/state.pt"
    assert model["source"]["step"] == 40 and model["checkpoint_meta"] == {"epoch": 4}


def test_promotion_copies_server_side_without_moving_bytes_through_the_worker(registry, object_store, monkeypatch):
    ckpt = save_checkpoint(object_store, 40)
    spy = Spy(monkeypatch, object_store)
    registry.promote("digits", run_prefix=RUN, checkpoint=ckpt, metrics={"accuracy": 0.9})

    root = object_store.uri
    sources = {f"{root}/{RUN}/checkpoints/{ckpt}/{f}" for f in ("state.pt", "optim.pt")}
    targets = {f"{root}/models/digits/v1/{f}" for f in ("state.pt", "optim.pt")}
    # Every file went by server-side copy, from the checkpoint to the version folder...
    assert {tuple(c) for c in spy.calls["copy"]} == {
        (f"{root}/{RUN}/checkpoints/{ckpt}/{f}", f"{root}/models/digits/v1/{f}") for f in ("state.pt", "optim.pt")}
    # ...no checkpoint file was downloaded and no model file uploaded by this process...
    assert not sources & set(spy.calls["get_bytes"] + spy.calls["get_file"])
    assert not targets & set(spy.calls["put_bytes"] + spy.calls["put_file"])
    assert spy.calls["get_file"] == [] and spy.calls["put_file"] == []
    # ...and each copy was read exactly once, to check its sha256 against the checkpoint MANIFEST.
    assert sorted(k for k in spy.calls["get_bytes"] if k in targets) == sorted(targets)
    # The only uploads are the two small JSON documents, MODEL.json before the pointer.
    assert spy.calls["put_bytes"] == [f"{root}/models/digits/v1/MODEL.json", f"{root}/models/digits/production.json"]


def test_second_promotion_switches_the_pointer_and_keeps_the_old_version(registry, object_store):
    registry.promote("digits", run_prefix=RUN, checkpoint=save_checkpoint(object_store, 40), metrics={"accuracy": 0.9})
    ckpt = save_checkpoint(object_store, 80)
    promotion = registry.promote("digits", run_prefix=RUN, checkpoint=ckpt, metrics={"accuracy": 0.95})
    assert (promotion.version, promotion.previous) == (2, 1)
    assert registry.versions("digits") == [1, 2]
    pointer = registry.production("digits")
    assert (pointer.version, pointer.previous, pointer.checkpoint) == (2, 1, ckpt)
    assert object_store.get_bytes("models/digits/v1/state.pt") == b"weights40"


def test_promoting_the_same_checkpoint_twice_makes_no_new_version(registry, object_store, monkeypatch):
    ckpt = save_checkpoint(object_store, 40)
    first = registry.promote("digits", run_prefix=RUN, checkpoint=ckpt, metrics={"accuracy": 0.9})
    spy = Spy(monkeypatch, object_store)
    again = registry.promote("digits", run_prefix=RUN, checkpoint=ckpt, metrics={"accuracy": 0.9})
    assert (again.version, again.new_version) == (1, False)
    assert again.pointer == first.pointer  # not even rewritten
    assert registry.versions("digits") == [1]
    assert spy.calls["copy"] == [] and spy.calls["put_bytes"] == []


def test_promoting_an_existing_version_after_a_rollback_points_at_it_again(registry, object_store):
    old = save_checkpoint(object_store, 40)
    new = save_checkpoint(object_store, 80)
    registry.promote("digits", run_prefix=RUN, checkpoint=old, metrics={})
    registry.promote("digits", run_prefix=RUN, checkpoint=new, metrics={})
    registry.rollback("digits")
    again = registry.promote("digits", run_prefix=RUN, checkpoint=new, metrics={})
    assert (again.version, again.new_version, again.previous) == (2, False, 1)
    assert registry.production("digits").version == 2 and registry.versions("digits") == [1, 2]


@pytest.mark.parametrize("tamper", ["same size, other bytes", "truncated", "missing"])
def test_a_tampered_checkpoint_is_refused_and_production_is_unchanged(registry, object_store, tamper):
    registry.promote("digits", run_prefix=RUN, checkpoint=save_checkpoint(object_store, 40), metrics={})
    ckpt = save_checkpoint(object_store, 80)
    key = f"{RUN}/checkpoints/{ckpt}/state.pt"
    if tamper == "missing":
        object_store.delete(key)
    else:
        object_store.put_bytes(key, b"WEIGHTS80" if tamper == "same size, other bytes" else b"w")
    before = object_store.get_bytes("models/digits/production.json")

    with pytest.raises(CheckpointCorrupt) as excinfo:
        registry.promote("digits", run_prefix=RUN, checkpoint=ckpt, metrics={})
    assert ckpt in str(excinfo.value) and "state.pt" in str(excinfo.value)
    assert object_store.get_bytes("models/digits/production.json") == before
    assert registry.versions("digits") == [1]
    assert list(object_store.list("models/digits/v2/")) == []  # the refused copy was cleaned up


def test_rollback_walks_back_and_to_a_given_version(registry, object_store):
    for step in (10, 20, 30):
        registry.promote("digits", run_prefix=RUN, checkpoint=save_checkpoint(object_store, step), metrics={"step": step})
    pointer = registry.rollback("digits")
    assert (pointer.version, pointer.previous, pointer.action) == (2, 1, "rollback")
    assert pointer.metrics == {"step": 20}
    assert registry.rollback("digits").version == 1
    with pytest.raises(RegistryError, match="no previous version"):
        registry.rollback("digits")
    assert registry.rollback("digits", to_version=3).version == 3
    assert registry.versions("digits") == [1, 2, 3]  # versions are never deleted
    with pytest.raises(RegistryError, match="no complete version 7"):
        registry.rollback("digits", to_version=7)
    with pytest.raises(RegistryError, match="no production version"):
        registry.rollback("other")


def test_a_crashed_attempt_leaves_its_version_number_unused(registry, object_store):
    registry.promote("digits", run_prefix=RUN, checkpoint=save_checkpoint(object_store, 10), metrics={})
    object_store.put_bytes("models/digits/v2/state.pt", b"half a copy")  # no MODEL.json: incomplete
    promotion = registry.promote("digits", run_prefix=RUN, checkpoint=save_checkpoint(object_store, 20), metrics={})
    assert promotion.version == 3
    assert registry.versions("digits") == [1, 3]


def test_missing_checkpoint_and_bad_names_are_clear_errors(registry, object_store):
    with pytest.raises(ObjectNotFound, match="ckpt-000000099"):
        registry.promote("digits", run_prefix=RUN, checkpoint="ckpt-000000099", metrics={})
    with pytest.raises(RegistryError, match="model name"):
        registry.versions("../etc")
    assert registry.production("digits") is None and registry.versions("digits") == []


def test_promotion_from_another_store_goes_through_the_worker(registry, object_store, tmp_path):
    elsewhere = LocalFolderStore(tmp_path / "elsewhere")
    ckpt = save_checkpoint(elsewhere, 40)
    promotion = registry.promote("digits", run_prefix=RUN, checkpoint=ckpt, metrics={}, source_store=elsewhere)
    assert promotion.version == 1
    assert object_store.get_bytes("models/digits/v1/state.pt") == b"weights40"
    elsewhere.put_bytes(join_key(RUN, "checkpoints", save_checkpoint(elsewhere, 50), "optim.pt"), b"tampered")
    with pytest.raises(CheckpointCorrupt):
        registry.promote("digits", run_prefix=RUN, checkpoint="ckpt-000000050", metrics={}, source_store=elsewhere)
    assert registry.production("digits").version == 1


@pytest.mark.parametrize("store_uri, run_uri, expected", [
    ("s3://bucket/ml", "s3://bucket/ml/runs/7", "runs/7"),
    ("s3://bucket", "s3://bucket/runs/7/", "runs/7"),
    ("/data/ringflow", "/data/ringflow/runs/7", "runs/7"),
    ("/data/ringflow", "file:///data/ringflow/runs/7", "runs/7"),
    ("file:///data/ring%20flow", "/data/ring flow/runs/7", "runs/7"),
])
def test_run_prefix_in_the_store(store_uri, run_uri, expected):
    assert run_prefix_in(store_uri, run_uri) == expected


@pytest.mark.parametrize("store_uri, run_uri", [
    ("s3://bucket/ml", "s3://other/ml/runs/7"),
    ("s3://bucket/ml", "s3://bucket/mlx/runs/7"),
    ("s3://bucket/ml", "s3://bucket/ml"),
    ("s3://bucket/ml", "/bucket/ml/runs/7"),
    ("/data/ringflow", "/data/elsewhere/runs/7"),
])
def test_a_run_outside_the_store_is_refused(store_uri, run_uri):
    with pytest.raises(RegistryError, match="not inside the registry's store"):
        run_prefix_in(store_uri, run_uri)
