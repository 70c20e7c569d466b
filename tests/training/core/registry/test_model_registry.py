"""ModelRegistry against both stores (the `object_store` fixture: a local folder, and S3 on moto,
marked slow). Checkpoints are written with CheckpointStore.save under a run folder's attempt: no torch needed.

Concurrency is tested two ways: exact interleavings in one process (`Interleave` runs another
promotion or rollback at a chosen point of this one), and many promoter processes released at once
(`promotion_race`)."""
from __future__ import annotations

import collections
import hashlib
import json

import pytest
from promotion_race import race
from run_folder_files import current_attempt, publish_checkpoint

from ringflow.training.formats.checkpoint import CheckpointCorrupt
from ringflow.training.core.registry.model_registry import (ModelRegistry, Pointer, ProductionMoved, RegistryError,
                                                       run_key_in)
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import LocalFolderStore, ObjectNotFound
from ringflow.training.store.base import join_key

RUN = "runs/run-1"


def run_in(store, run=RUN) -> str:
    """The URI of run folder `run` inside `store` (what a promoter is given: the train task's run_uri)."""
    return f"{store.uri.rstrip('/')}/{run}"


# Where a run folder's one attempt writes its checkpoints (run_folder.py).
CHECKPOINTS = "attempts/000001/checkpoints"


def save_checkpoint(store, step, run=RUN, payload=b"weights"):
    """A checkpoint published in run folder `run` by its one attempt; its name."""
    return publish_checkpoint(current_attempt(store.child(run)), step,
                              {"state.pt": payload + str(step).encode(), "optim.pt": b"optim-%d" % step},
                              {"epoch": step // 10})


@pytest.fixture
def registry(object_store):
    return ModelRegistry(object_store)


class Spy:
    """Records, per method, the full keys (store URI + key) that the store class was called with.
    Patched on the class, not the instance: `child()` copies instances, and the copies must be
    recorded too."""

    METHODS = ("get_bytes", "get_file", "put_bytes", "put_file", "copy", "get_bytes_tagged",
               "put_bytes_if_absent", "put_bytes_if_match", "delete")
    WRITES = ("put_bytes", "put_file", "copy", "put_bytes_if_absent", "put_bytes_if_match", "delete")

    def __init__(self, monkeypatch, store):
        self.calls = collections.defaultdict(list)
        self.writes = []  # (method, key) of every write, in order
        cls = type(store)
        for method in self.METHODS:
            original = getattr(cls, method)

            def wrapper(this, key, *args, _original=original, _method=method):
                full = [f"{this.uri}/{key}"] + ([f"{this.uri}/{args[0]}"] if _method == "copy" else [])
                self.calls[_method].append(full if _method == "copy" else full[0])
                if _method in self.WRITES:
                    self.writes.append((_method, full[-1]))
                return _original(this, key, *args)

            monkeypatch.setattr(cls, method, wrapper)


class Interleave:
    """`store`, except that `before()` runs once, just before the first `method` call on a key ending
    with `suffix`: another promoter's whole promotion (or a rollback) lands at exactly that point."""

    def __init__(self, store, method, suffix, before):
        self._store, self._method, self._suffix, self._before = store, method, suffix, before
        self.fired = False

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if name != self._method:
            return attr

        def hooked(key, *args):
            if not self.fired and key.endswith(self._suffix):
                self.fired = True
                self._before()
            return attr(key, *args)
        return hooked


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def assert_complete(store, registry, name, version):
    """MODEL.json present and every file it lists matches its sha256."""
    info = registry.model_info(name, version)
    for file, entry in info["files"].items():
        assert sha256(store.get_bytes(f"models/{name}/v{version}/{file}")) == entry["sha256"], (version, file)
    return info


def assert_explainable(history):
    """Revisions 1, 2, ... with each entry replacing the version of the entry before it."""
    assert [p.revision for p in history] == list(range(1, len(history) + 1))
    assert history[0].replaced is None
    assert all(b.replaced == a.version for a, b in zip(history, history[1:])), history


def test_first_promotion_copies_the_checkpoint_and_sets_the_pointer(registry, object_store):
    ckpt = save_checkpoint(object_store, 40)
    promotion = registry.promote("digits", run_uri=run_in(object_store), checkpoint=ckpt, metrics={"accuracy": 0.9})
    assert (promotion.version, promotion.new_version, promotion.previous) == (1, True, None)
    assert registry.versions("digits") == [1]
    assert object_store.get_bytes("models/digits/v1/state.pt") == b"weights40"
    assert object_store.get_bytes("models/digits/v1/optim.pt") == b"optim-40"

    pointer = json.loads(object_store.get_bytes("models/digits/production.json"))
    manifest = RunFolder(object_store.child(RUN)).checkpoints().read_manifest(ckpt)
    assert pointer["version"] == 1 and pointer["previous"] is None
    assert pointer["sha256"] == {f: e.sha256 for f, e in manifest.files.items()}
    assert pointer["checkpoint"] == ckpt and pointer["metrics"] == {"accuracy": 0.9}
    assert pointer["run_uri"] == run_in(object_store) and pointer["promoted_at"]

    model = registry.model_info("digits", 1)
    assert model["source"]["keys"]["state.pt"] == f"{RUN}/{CHECKPOINTS}/{ckpt}/state.pt"
    assert model["source"]["step"] == 40 and model["checkpoint_meta"] == {"epoch": 4}


def test_promotion_copies_server_side_without_moving_bytes_through_the_worker(registry, object_store, monkeypatch):
    ckpt = save_checkpoint(object_store, 40)
    spy = Spy(monkeypatch, object_store)
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=ckpt, metrics={"accuracy": 0.9})

    root = object_store.uri
    sources = {f"{root}/{RUN}/{CHECKPOINTS}/{ckpt}/{f}" for f in ("state.pt", "optim.pt")}
    targets = {f"{root}/models/digits/v1/{f}" for f in ("state.pt", "optim.pt")}
    # Every file went by server-side copy, from the checkpoint to the version folder...
    assert {tuple(c) for c in spy.calls["copy"]} == {
        (f"{root}/{RUN}/{CHECKPOINTS}/{ckpt}/{f}", f"{root}/models/digits/v1/{f}") for f in ("state.pt", "optim.pt")}
    # ...no checkpoint file was downloaded and no model file uploaded by this process...
    assert not sources & set(spy.calls["get_bytes"] + spy.calls["get_file"])
    assert not targets & set(spy.calls["put_bytes"] + spy.calls["put_file"])
    assert spy.calls["get_file"] == [] and spy.calls["put_file"] == []
    # ...and each copy was read exactly once, to check its sha256 against the checkpoint MANIFEST.
    assert sorted(k for k in spy.calls["get_bytes"] if k in targets) == sorted(targets)
    # The only uploads are small JSON documents, each created if absent: the claim on the number, then
    # MODEL.json after the copies, the pointer, and its history entry.
    assert [w for w in spy.writes if w[0] != "copy"] == [("put_bytes_if_absent", f"{root}/models/digits/{k}") for k in (
        "v1/CLAIM.json", "v1/MODEL.json", "production.json", "history/000000001.json")]


def test_second_promotion_switches_the_pointer_and_keeps_the_old_version(registry, object_store):
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 40),
                     metrics={"accuracy": 0.9})
    ckpt = save_checkpoint(object_store, 80)
    promotion = registry.promote("digits", run_uri=run_in(object_store), checkpoint=ckpt, metrics={"accuracy": 0.95})
    assert (promotion.version, promotion.previous) == (2, 1)
    assert registry.versions("digits") == [1, 2]
    pointer = registry.production("digits")
    assert (pointer.version, pointer.previous, pointer.checkpoint) == (2, 1, ckpt)
    assert object_store.get_bytes("models/digits/v1/state.pt") == b"weights40"


def test_promoting_the_same_checkpoint_twice_makes_no_new_version(registry, object_store, monkeypatch):
    ckpt = save_checkpoint(object_store, 40)
    first = registry.promote("digits", run_uri=run_in(object_store), checkpoint=ckpt, metrics={"accuracy": 0.9})
    spy = Spy(monkeypatch, object_store)
    again = registry.promote("digits", run_uri=run_in(object_store), checkpoint=ckpt, metrics={"accuracy": 0.9})
    assert (again.version, again.new_version) == (1, False)
    assert again.pointer == first.pointer  # not even rewritten
    assert registry.versions("digits") == [1]
    assert spy.writes == []


def test_promoting_an_existing_version_after_a_rollback_points_at_it_again(registry, object_store):
    old = save_checkpoint(object_store, 40)
    new = save_checkpoint(object_store, 80)
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=old, metrics={})
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=new, metrics={})
    registry.rollback("digits")
    again = registry.promote("digits", run_uri=run_in(object_store), checkpoint=new, metrics={})
    assert (again.version, again.new_version, again.previous) == (2, False, 1)
    assert registry.production("digits").version == 2 and registry.versions("digits") == [1, 2]


@pytest.mark.parametrize("tamper", ["same size, other bytes", "truncated", "missing"])
def test_a_tampered_checkpoint_is_refused_and_production_is_unchanged(registry, object_store, tamper):
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 40), metrics={})
    ckpt = save_checkpoint(object_store, 80)
    key = f"{RUN}/{CHECKPOINTS}/{ckpt}/state.pt"
    if tamper == "missing":
        object_store.delete(key)
    else:
        object_store.put_bytes(key, b"WEIGHTS80" if tamper == "same size, other bytes" else b"w")
    before = object_store.get_bytes("models/digits/production.json")

    with pytest.raises(CheckpointCorrupt) as excinfo:
        registry.promote("digits", run_uri=run_in(object_store), checkpoint=ckpt, metrics={})
    assert ckpt in str(excinfo.value) and "state.pt" in str(excinfo.value)
    assert object_store.get_bytes("models/digits/production.json") == before
    assert registry.versions("digits") == [1]
    # The refused copy was cleaned up; the claim stays, marked, so number 2 is never handed out again.
    assert [i.key for i in object_store.list("models/digits/v2/")] == ["models/digits/v2/CLAIM.json"]
    claim = json.loads(object_store.get_bytes("models/digits/v2/CLAIM.json"))
    assert claim["state"] == "abandoned" and "CheckpointCorrupt" in claim["error"] and ckpt in claim["error"]
    assert registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 90),
                            metrics={}).version == 3


def test_rollback_walks_back_and_to_a_given_version(registry, object_store):
    for step in (10, 20, 30):
        registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, step),
                         metrics={"step": step})
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


@pytest.mark.parametrize("leftovers", [
    ["CLAIM.json"],  # a promoter killed right after claiming
    ["CLAIM.json", "state.pt"],  # ...or halfway through its copy
    ["state.pt"],  # an older ringflow that did not claim, killed mid-copy
])
def test_a_crashed_attempt_leaves_its_version_number_unused(registry, object_store, leftovers):
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 10), metrics={})
    for file in leftovers:  # no MODEL.json: incomplete
        object_store.put_bytes(f"models/digits/v2/{file}", b"half a copy")
    promotion = registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store,
                                 20), metrics={})
    assert promotion.version == 3
    assert registry.versions("digits") == [1, 3]
    assert object_store.get_bytes("models/digits/v2/state.pt" if "state.pt" in leftovers
                                  else "models/digits/v2/CLAIM.json") == b"half a copy"  # not touched


def test_pointer_history_explains_every_change(registry, object_store):
    for step in (10, 20, 30):
        registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, step),
                         metrics={"step": step})
    registry.rollback("digits")
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 40),
                     metrics={"step": 40})
    history = registry.history("digits")
    assert_explainable(history)
    assert [(p.action, p.version, p.replaced) for p in history] == [
        ("promote", 1, None), ("promote", 2, 1), ("promote", 3, 2), ("rollback", 2, 3), ("promote", 4, 2)]
    assert history[-1] == registry.production("digits")
    assert len({p.writer for p in history}) == 5 and all(p.writer for p in history)
    assert [i.key.rsplit("/", 1)[1] for i in object_store.list("models/digits/history/")] == [
        f"{r:09d}.json" for r in range(1, 6)]


def test_a_history_entry_lost_in_a_crash_is_written_by_the_next_change(registry, object_store):
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 10), metrics={})
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 20), metrics={})
    pointer = object_store.get_bytes("models/digits/production.json")
    object_store.delete("models/digits/history/000000002.json")  # killed between the pointer and its entry
    assert [p.revision for p in registry.history("digits")] == [1, 2]  # the pointer stands in for it
    registry.rollback("digits")
    assert object_store.get_bytes("models/digits/history/000000002.json") == pointer
    assert_explainable(registry.history("digits"))


def test_a_pointer_written_before_revisions_existed_is_replaced_and_kept(registry, object_store):
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 10), metrics={})
    old = json.loads(object_store.get_bytes("models/digits/production.json"))
    for field in ("revision", "replaced", "writer"):
        del old[field]
    object_store.delete_prefix("models/digits/history/")
    object_store.put_bytes("models/digits/production.json", json.dumps(old).encode())
    promotion = registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store,
                                 20), metrics={})
    assert (promotion.pointer.revision, promotion.pointer.replaced) == (1, 1)
    assert [(p.revision, p.version) for p in registry.history("digits")] == [(0, 1), (1, 2)]


# -- concurrent writers --------------------------------------------------------------------------

def gate_on(accuracy):
    def decide(current):
        if current is not None and current.metrics["accuracy"] > accuracy:
            return f"worse than version {current.version}"
        return None
    return decide


@pytest.mark.parametrize("write", ["put_bytes_if_absent", "put_bytes_if_match"])
def test_the_gate_is_judged_against_the_pointer_it_replaces(object_store, write):
    """B (0.90) read production and passed its gate; A (0.95) lands before B's pointer write. B must
    not overwrite A: it loses the swap, asks its gate again with A's pointer, and stays out."""
    registry = ModelRegistry(object_store)
    if write == "put_bytes_if_match":  # production exists: B's write replaces it
        registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 5),
                         metrics={"accuracy": 0.5})
    a, b = save_checkpoint(object_store, 10), save_checkpoint(object_store, 20)
    seen = []

    def decide_b(current):
        seen.append(current.version if current else None)
        return gate_on(0.90)(current)

    landed = {}
    racing = Interleave(object_store, write, "production.json", lambda: landed.update(a=registry.promote(
        "digits", run_uri=run_in(object_store), checkpoint=a, metrics={"accuracy": 0.95}, decide=gate_on(0.95))))
    outcome = ModelRegistry(racing).promote("digits", run_uri=run_in(object_store), checkpoint=b,
                                            metrics={"accuracy": 0.90},
                                            decide=decide_b)
    assert racing.fired
    assert not outcome.promoted and outcome.reason == f"worse than version {landed['a'].version}"
    assert seen == [seen[0], landed["a"].version]  # decided once more, against A
    assert registry.production("digits").version == landed["a"].version
    assert_complete(object_store, registry, "digits", outcome.version)  # B's version exists, out of production
    history = registry.history("digits")
    assert_explainable(history)
    assert outcome.version not in [p.version for p in history]


def test_a_promotion_that_loses_the_swap_still_lands_when_its_gate_allows(registry, object_store):
    a, b = save_checkpoint(object_store, 10), save_checkpoint(object_store, 20)
    racing = Interleave(object_store, "put_bytes_if_absent", "production.json", lambda: registry.promote(
        "digits", run_uri=run_in(object_store), checkpoint=a, metrics={"accuracy": 0.90}))
    outcome = ModelRegistry(racing).promote("digits", run_uri=run_in(object_store), checkpoint=b,
                                            metrics={"accuracy": 0.95},
                                            decide=gate_on(0.95))
    assert outcome.promoted and (outcome.version, outcome.previous) == (1, 2)  # B claimed 1 first; A got 2
    assert [(p.version, p.replaced) for p in registry.history("digits")] == [(2, None), (1, 2)]


def test_a_rollback_does_not_remove_a_version_that_landed_after_it_looked(registry, object_store):
    for step in (10, 20):
        registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, step),
                         metrics={})
    c = save_checkpoint(object_store, 30)
    racing = Interleave(object_store, "put_bytes_if_match", "production.json",
                        lambda: registry.promote("digits", run_uri=run_in(object_store), checkpoint=c, metrics={}))
    with pytest.raises(ProductionMoved, match="production is version 3 .*not version 2 this rollback was meant"):
        ModelRegistry(racing).rollback("digits")
    assert registry.production("digits").version == 3
    with pytest.raises(ProductionMoved, match="not version 2"):
        registry.rollback("digits", from_version=2)
    # Told where to go, a rollback goes there whatever production became meanwhile.
    d = save_checkpoint(object_store, 40)
    racing = Interleave(object_store, "put_bytes_if_match", "production.json",
                        lambda: registry.promote("digits", run_uri=run_in(object_store), checkpoint=d, metrics={}))
    assert ModelRegistry(racing).rollback("digits", to_version=1).version == 1
    history = registry.history("digits")
    assert_explainable(history)
    assert [(p.action, p.version) for p in history][-2:] == [("promote", 4), ("rollback", 1)]


def test_a_promotion_that_loses_to_a_rollback_is_judged_against_the_rolled_back_version(registry, object_store):
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 10),
                     metrics={"accuracy": 0.8})
    registry.promote("digits", run_uri=run_in(object_store), checkpoint=save_checkpoint(object_store, 20),
                     metrics={"accuracy": 0.9})
    seen = []

    def decide(current):
        seen.append(current.version)
        return gate_on(0.95)(current)

    racing = Interleave(object_store, "put_bytes_if_match", "production.json", lambda: registry.rollback("digits"))
    outcome = ModelRegistry(racing).promote("digits", run_uri=run_in(object_store),
                                            checkpoint=save_checkpoint(object_store, 30),
                                            metrics={"accuracy": 0.95}, decide=decide)
    assert seen == [2, 1] and outcome.promoted and outcome.previous == 1
    assert [(p.action, p.version, p.replaced) for p in registry.history("digits")] == [
        ("promote", 1, None), ("promote", 2, 1), ("rollback", 1, 2), ("promote", 3, 1)]


@pytest.mark.parametrize("second_checkpoint", ["good", "tampered"])
def test_a_promoter_never_writes_or_cleans_up_another_promoters_version(registry, object_store, second_checkpoint):
    """The old failure: two promoters took the same number, one saw the other's bytes in "its" folder
    (a false CheckpointCorrupt) and its clean-up deleted the other's state.pt."""
    a, b = save_checkpoint(object_store, 10), save_checkpoint(object_store, 20)
    if second_checkpoint == "tampered":
        object_store.put_bytes(f"{RUN}/{CHECKPOINTS}/{b}/state.pt", b"WEIGHTS20")
    landed = {}
    # A's whole promotion runs while B is between its claim and its first copy.
    racing = Interleave(object_store, "copy", "", lambda: landed.update(a=registry.promote(
        "digits", run_uri=run_in(object_store), checkpoint=a, metrics={})))
    if second_checkpoint == "tampered":
        with pytest.raises(CheckpointCorrupt, match=b):
            ModelRegistry(racing).promote("digits", run_uri=run_in(object_store), checkpoint=b, metrics={})
        assert registry.versions("digits") == [landed["a"].version] == [2]
        assert [i.key for i in object_store.list("models/digits/v1/")] == ["models/digits/v1/CLAIM.json"]
    else:
        outcome = ModelRegistry(racing).promote("digits", run_uri=run_in(object_store), checkpoint=b, metrics={})
        assert (outcome.version, landed["a"].version) == (1, 2) and registry.versions("digits") == [1, 2]
        assert object_store.get_bytes("models/digits/v1/state.pt") == b"weights20"
    assert object_store.get_bytes("models/digits/v2/state.pt") == b"weights10"
    assert_complete(object_store, registry, "digits", 2)


@pytest.mark.job
def test_many_promoters_at_once_get_distinct_complete_versions_and_lose_no_pointer_update(object_store, request):
    n = 8
    ckpts = [save_checkpoint(object_store, 10 * (i + 1)) for i in range(n)]
    env = request.getfixturevalue("s3_server").env() if object_store.uri.startswith("s3://") else {}
    outcomes = race([{"store": object_store.uri, "model": "digits", "run": RUN, "checkpoint": ckpt,
                      "metrics": {"promoter": i}} for i, ckpt in enumerate(ckpts)], env)
    assert all("error" not in o for o in outcomes), outcomes
    registry = ModelRegistry(object_store)
    # Every version distinct and complete, each holding its own promoter's checkpoint.
    assert sorted(o["version"] for o in outcomes) == registry.versions("digits") == list(range(1, n + 1))
    for i, o in enumerate(outcomes):
        info = assert_complete(object_store, registry, "digits", o["version"])
        assert info["source"]["checkpoint"] == ckpts[i] and info["metrics"] == {"promoter": i}
        assert object_store.get_bytes(f"models/digits/v{o['version']}/state.pt") == b"weights%d" % (10 * (i + 1))
    # No pointer update lost: every promoter moved it exactly once, each replacing the one before.
    assert all(o["promoted"] for o in outcomes)
    history = registry.history("digits")
    assert_explainable(history)
    assert len(list(object_store.list("models/digits/history/"))) == n
    assert sorted(p.version for p in history) == list(range(1, n + 1))
    by_version = {p.version: p for p in history}
    assert all(by_version[o["version"]].replaced == o["previous"] for o in outcomes)
    assert all(by_version[o["version"]].revision == o["revision"] for o in outcomes)
    assert registry.production("digits") == history[-1]


def test_missing_checkpoint_and_bad_names_are_clear_errors(registry, object_store):
    with pytest.raises(ObjectNotFound, match="ckpt-000000099"):
        registry.promote("digits", run_uri=run_in(object_store), checkpoint="ckpt-000000099", metrics={})
    with pytest.raises(RegistryError, match="model name"):
        registry.versions("../etc")
    assert registry.production("digits") is None and registry.versions("digits") == []


def test_promotion_from_another_store_goes_through_the_worker(registry, object_store, tmp_path):
    elsewhere = LocalFolderStore(tmp_path / "elsewhere")
    ckpt = save_checkpoint(elsewhere, 40)
    promotion = registry.promote("digits", run_uri=run_in(elsewhere), checkpoint=ckpt, metrics={},
                                 source_store=elsewhere)
    assert promotion.version == 1
    assert object_store.get_bytes("models/digits/v1/state.pt") == b"weights40"
    elsewhere.put_bytes(join_key(RUN, CHECKPOINTS, save_checkpoint(elsewhere, 50), "optim.pt"), b"tampered")
    with pytest.raises(CheckpointCorrupt):
        registry.promote("digits", run_uri=run_in(elsewhere), checkpoint="ckpt-000000050", metrics={},
                         source_store=elsewhere)
    assert registry.production("digits").version == 1


@pytest.mark.parametrize("store_uri, run_uri, expected", [
    ("s3://bucket/ml", "s3://bucket/ml/runs/7", "runs/7"),
    ("s3://bucket", "s3://bucket/runs/7/", "runs/7"),
    ("/data/ringflow", "/data/ringflow/runs/7", "runs/7"),
    ("/data/ringflow", "file:///data/ringflow/runs/7", "runs/7"),
    ("file:///data/ring%20flow", "/data/ring flow/runs/7", "runs/7"),
])
def test_run_key_in_the_store(store_uri, run_uri, expected):
    assert run_key_in(store_uri, run_uri) == expected


@pytest.mark.parametrize("store_uri, run_uri", [
    ("s3://bucket/ml", "s3://other/ml/runs/7"),
    ("s3://bucket/ml", "s3://bucket/mlx/runs/7"),
    ("s3://bucket/ml", "s3://bucket/ml"),
    ("s3://bucket/ml", "/bucket/ml/runs/7"),
    ("/data/ringflow", "/data/elsewhere/runs/7"),
])
def test_a_run_outside_the_store_is_refused(store_uri, run_uri):
    with pytest.raises(RegistryError, match="not inside the registry's store"):
        run_key_in(store_uri, run_uri)


def test_a_pointer_without_its_run_is_refused():
    doc = {"version": 1, "sha256": {}, "checkpoint": "ckpt-000000040", "metrics": {},
           "promoted_at": "2025-01-01T00:00:00+00:00", "previous": None}
    with pytest.raises(RegistryError, match="production.json is not a valid production pointer"):
        Pointer.from_json(json.dumps(doc), "production.json")
