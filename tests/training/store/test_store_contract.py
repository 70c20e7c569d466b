"""One contract, every backend: code that works on the laptop folder must work on S3 unchanged.

Tests taking `object_store` run once per implementation (the fixture below); the S3 ones are in the job
tier because they need the moto server. Elsewhere `object_store` is the local folder alone (tests/conftest.py):
what is proven here of S3 holds for every caller of the store interface.
"""
from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import threading
import time

import pytest

from ringflow.training.store import (InvalidKey, LocalFolderStore, ObjectInfo, ObjectNotFound, PreconditionFailed,
                                     S3Settings, S3Store, StoreConfigError, open_store, split_uri)
from ringflow.training.store.base import TransferCancelled
from ringflow.training.store.local import LOCK_SUFFIX, TMP_SUFFIX

from empty_stores import empty_store

BIG = 20 * 1024 * 1024  # over the 16 MiB part size: the S3 upload goes multipart


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.job)])
def object_store(request, tmp_path):
    """An empty store of each kind (tests/empty_stores.py)."""
    return empty_store(request.param, request, tmp_path)


def test_put_get_bytes_and_overwrite(object_store):
    object_store.put_bytes("a/b/c.bin", b"one")
    assert object_store.get_bytes("a/b/c.bin") == b"one"
    object_store.put_bytes("a/b/c.bin", b"")
    assert object_store.get_bytes("a/b/c.bin") == b""
    object_store.put_bytes("a/b/c.bin", bytes(range(256)))
    assert object_store.get_bytes("a/b/c.bin") == bytes(range(256))


def test_put_file_get_file(object_store, tmp_path):
    src = tmp_path / "src.txt"
    src.write_bytes(b"hello file")
    object_store.put_file("files/hello.txt", str(src))
    dst = tmp_path / "out" / "nested" / "hello.txt"  # missing folders are created
    object_store.get_file("files/hello.txt", str(dst))
    assert dst.read_bytes() == b"hello file"


def test_big_file_round_trip(object_store, tmp_path):
    src = tmp_path / "big.bin"
    block = os.urandom(1024 * 1024)
    with open(src, "wb") as f:
        for i in range(BIG // len(block)):
            f.write(bytes([i]) + block[1:])
    object_store.put_file("big/big.bin", str(src))
    assert object_store.stat("big/big.bin") == ObjectInfo("big/big.bin", BIG)
    dst = tmp_path / "downloads" / "big.out"
    object_store.get_file("big/big.bin", str(dst))
    assert dst.read_bytes() == src.read_bytes()
    if isinstance(object_store, S3Store):
        etag = object_store._client.head_object(Bucket=object_store.bucket, Key="run-1/big/big.bin")["ETag"]
        assert etag.strip('"').endswith("-2"), f"expected a 2-part multipart upload, etag {etag}"
    assert os.listdir(tmp_path / "downloads") == ["big.out"]  # no download leftovers


def test_exists_and_stat(object_store):
    assert not object_store.exists("x/y")
    object_store.put_bytes("x/y", b"12345")
    assert object_store.exists("x/y")
    assert not object_store.exists("x")  # a "folder" is not an object
    assert object_store.stat("x/y") == ObjectInfo(key="x/y", size=5)


def test_list_is_sorted_recursive_and_prefix_filtered(object_store):
    keys = ["b/2", "a/1", "a/b/3", "a/b1", "c", "a/a/a/4"]
    for i, key in enumerate(keys):
        object_store.put_bytes(key, b"x" * i)
    assert [i.key for i in object_store.list()] == sorted(keys)
    assert [i.key for i in object_store.list("a/")] == ["a/1", "a/a/a/4", "a/b/3", "a/b1"]
    assert [i.key for i in object_store.list("a/b")] == ["a/b/3", "a/b1"]  # a string prefix, not a folder
    assert [i.key for i in object_store.list("a/b/")] == ["a/b/3"]
    assert list(object_store.list("nothing/")) == []
    assert {i.key: i.size for i in object_store.list("b")} == {"b/2": 0}


def test_delete(object_store):
    object_store.delete("never/was")  # missing is fine
    object_store.put_bytes("d/1", b"1")
    object_store.put_bytes("d/2", b"2")
    object_store.delete("d/1")
    assert not object_store.exists("d/1") and object_store.exists("d/2")
    object_store.delete_prefix("d/")
    assert list(object_store.list()) == []


def test_copy(object_store):
    object_store.put_bytes("src/model.pt", b"weights")
    object_store.copy("src/model.pt", "dst/deep/model.pt")
    assert object_store.get_bytes("dst/deep/model.pt") == b"weights"
    assert object_store.get_bytes("src/model.pt") == b"weights"
    with pytest.raises(ObjectNotFound):
        object_store.copy("src/missing.pt", "dst/x")


@pytest.mark.job
def test_s3_copy_is_server_side(s3_server, monkeypatch):
    store = S3Store.from_settings(s3_server.new_bucket(), "p", s3_server.settings())
    store.put_bytes("a", b"payload")

    def no_transfer(*args, **kwargs):
        raise AssertionError("copy moved bytes through this process")

    for method in ("get_object", "put_object", "upload_part", "download_file", "upload_file", "upload_fileobj"):
        monkeypatch.setattr(store._client, method, no_transfer)
    store.copy("a", "b")
    monkeypatch.undo()
    assert store.get_bytes("b") == b"payload"


# -- conditional writes ----------------------------------------------------------------------------

def test_get_bytes_tagged_names_the_version(object_store):
    object_store.put_bytes("p/ptr", b"one")
    data, etag = object_store.get_bytes_tagged("p/ptr")
    assert data == b"one" and isinstance(etag, str) and etag
    assert object_store.get_bytes_tagged("p/ptr")[1] == etag  # unchanged content, same tag
    object_store.put_bytes("p/ptr", b"two")
    assert object_store.get_bytes_tagged("p/ptr") != (b"one", etag)
    with pytest.raises(ObjectNotFound, match="p/nope"):
        object_store.get_bytes_tagged("p/nope")


def test_put_if_absent_creates_once(object_store):
    etag = object_store.put_bytes_if_absent("v/1/CLAIM", b"writer-a")
    assert object_store.get_bytes_tagged("v/1/CLAIM") == (b"writer-a", etag)
    with pytest.raises(PreconditionFailed, match="v/1/CLAIM"):
        object_store.put_bytes_if_absent("v/1/CLAIM", b"writer-b")
    assert object_store.get_bytes("v/1/CLAIM") == b"writer-a"
    object_store.delete("v/1/CLAIM")
    object_store.put_bytes_if_absent("v/1/CLAIM", b"writer-c")  # absent again: a create succeeds
    assert object_store.get_bytes("v/1/CLAIM") == b"writer-c"
    assert [i.key for i in object_store.list()] == ["v/1/CLAIM"]  # no temp or lock files listed


def test_put_if_match_is_compare_and_swap(object_store):
    first = object_store.put_bytes_if_absent("ptr", b"v1")
    second = object_store.put_bytes_if_match("ptr", b"v2", first)
    assert object_store.get_bytes_tagged("ptr") == (b"v2", second) and second != first
    with pytest.raises(PreconditionFailed, match="ptr"):
        object_store.put_bytes_if_match("ptr", b"v3-stale", first)  # read before v2 was written
    assert object_store.get_bytes("ptr") == b"v2"
    with pytest.raises(PreconditionFailed, match="missing"):
        object_store.put_bytes_if_match("missing", b"x", second)
    object_store.delete("ptr")
    with pytest.raises(PreconditionFailed):
        object_store.put_bytes_if_match("ptr", b"v3", second)
    assert not object_store.exists("ptr") and not object_store.exists("missing")
    assert [i.key for i in object_store.list()] == []


def test_concurrent_creators_exactly_one_wins(object_store):
    n = 8
    barrier = threading.Barrier(n)

    def claim(i: int) -> str:
        barrier.wait()
        try:
            object_store.put_bytes_if_absent("race/v1", f"writer-{i}".encode())
            return f"writer-{i}"
        except PreconditionFailed:
            return "lost"

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(claim, range(n)))
    winners = [r for r in results if r != "lost"]
    assert len(winners) == 1, results
    assert object_store.get_bytes("race/v1") == winners[0].encode()


def _increment(store, key: str, times: int, writer: str) -> int:
    """Read-modify-write a JSON counter with compare-and-swap; returns how many races it lost."""
    lost = 0
    for _ in range(times):
        while True:
            data, etag = store.get_bytes_tagged(key)
            doc = json.loads(data)
            doc = {"n": doc["n"] + 1, "by": doc["by"] + [writer]}
            try:
                store.put_bytes_if_match(key, json.dumps(doc).encode(), etag)
                break
            except PreconditionFailed:
                lost += 1
    return lost


def test_concurrent_counter_loses_no_update(object_store):
    n, times = 6, 5
    object_store.put_bytes_if_absent("counter", json.dumps({"n": 0, "by": []}).encode())
    barrier = threading.Barrier(n)

    def run(i: int) -> int:
        barrier.wait()
        return _increment(object_store, "counter", times, f"w{i}")

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        lost = sum(pool.map(run, range(n)))
    doc = json.loads(object_store.get_bytes("counter"))
    assert doc["n"] == n * times and sorted(doc["by"]) == sorted(f"w{i}" for i in range(n) for _ in range(times))
    assert lost > 0, "the writers never raced; the test proved nothing"


def _process_claim(root: str, i: int, start: float) -> bool:
    time.sleep(max(0.0, start - time.time()))
    try:
        LocalFolderStore(root).put_bytes_if_absent("race/v1", f"p{i}".encode())
        return True
    except PreconditionFailed:
        return False


def _process_count(root: str, i: int, times: int, start: float) -> int:
    time.sleep(max(0.0, start - time.time()))
    return _increment(LocalFolderStore(root), "counter", times, f"p{i}")


@pytest.mark.job
def test_local_conditional_writes_across_processes(tmp_path):
    """The local store's guarantees hold between processes (link, flock), not only threads."""
    root, n = str(tmp_path / "store"), 4
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=ctx) as pool:
        list(pool.map(abs, range(n)))  # start the workers before the race
        start = time.time() + 0.5
        wins = list(pool.map(_process_claim, [root] * n, range(n), [start] * n))
        assert wins.count(True) == 1, wins
        LocalFolderStore(root).put_bytes_if_absent("counter", json.dumps({"n": 0, "by": []}).encode())
        start = time.time() + 0.5
        list(pool.map(_process_count, [root] * n, range(n), [20] * n, [start] * n))
    assert json.loads(LocalFolderStore(root).get_bytes("counter"))["n"] == n * 20


def test_local_lock_files_are_hidden_and_reserved(tmp_path):
    store = LocalFolderStore(tmp_path)
    etag = store.put_bytes_if_absent("m/ptr", b"1")
    store.put_bytes_if_match("m/ptr", b"2", etag)
    assert [p.name for p in (tmp_path / "m").iterdir() if p.name.endswith(LOCK_SUFFIX)]  # it exists ...
    assert [i.key for i in store.list()] == ["m/ptr"]  # ... but is no object
    with pytest.raises(InvalidKey, match="reserved"):
        store.put_bytes(f"m/.ptr{LOCK_SUFFIX}", b"")
    assert not list(tmp_path.glob(f"**/*{TMP_SUFFIX}"))


def test_a_read_whose_progress_cancels_it_stops_there(object_store):
    """A reader that has gone raises TransferCancelled from its progress callback: the read ends there, with no
    retry (the callback is not called again) and no store error; the store reads on as before. S3 reads 1 MiB
    chunks, so a 4 MiB range is abandoned after its first."""
    data = os.urandom(4 * 1024 * 1024)
    object_store.put_bytes("big.bin", data)
    calls = []

    def gone(nbytes: int) -> None:
        calls.append(nbytes)
        raise TransferCancelled("the reader was closed")

    with pytest.raises(TransferCancelled):
        object_store.get_range("big.bin", 0, len(data), progress=gone)
    with pytest.raises(TransferCancelled):
        object_store.get_bytes("big.bin", progress=gone)
    assert len(calls) == 2
    assert object_store.get_range("big.bin", 1, 10) == data[1:11]


def test_missing_objects_raise_object_not_found(object_store, tmp_path):
    with pytest.raises(ObjectNotFound, match="nope"):
        object_store.get_bytes("nope")
    with pytest.raises(ObjectNotFound):
        object_store.get_file("nope", str(tmp_path / "f"))
    with pytest.raises(ObjectNotFound):
        object_store.stat("dir/nope")
    assert issubclass(ObjectNotFound, KeyError)
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("key", ["../escape", "a/../../b", "/etc/passwd", "a//b", "a/./b", "", "a\\b", "a/"])
def test_bad_keys_are_rejected(object_store, key, tmp_path):
    for call in (lambda: object_store.put_bytes(key, b"x"), lambda: object_store.get_bytes(key),
                 lambda: object_store.exists(key), lambda: object_store.delete(key),
                 lambda: object_store.copy("ok", key), lambda: object_store.list("../")):
        with pytest.raises(InvalidKey):
            call()
    assert not (tmp_path / "escape").exists()


def test_child_store(object_store):
    child = object_store.child("runs/run-7")
    child.put_bytes("ckpt/a", b"1")
    assert object_store.get_bytes("runs/run-7/ckpt/a") == b"1"
    assert [i.key for i in child.list()] == ["ckpt/a"]
    assert child.uri == object_store.uri + "/runs/run-7"


def test_uri_reopens_the_same_store(object_store, request):
    object_store.put_bytes("k", b"v")
    settings = request.getfixturevalue("s3_server").settings() if isinstance(object_store, S3Store) else None
    assert open_store(object_store.uri, s3=settings).get_bytes("k") == b"v"
    parent, name = split_uri(object_store.uri + "/k")
    assert (parent, name) == (object_store.uri, "k")


# -- local folder specifics ------------------------------------------------------------------------

def test_local_uri_and_plain_paths(tmp_path, monkeypatch):
    store = LocalFolderStore(tmp_path / "root")
    assert store.uri == f"file://{tmp_path}/root"
    store.put_bytes("x/y.json", b"{}")
    monkeypatch.chdir(tmp_path)
    for uri in (str(tmp_path / "root"), f"file://{tmp_path}/root", "root", "./root"):
        opened = open_store(uri)
        assert isinstance(opened, LocalFolderStore) and opened.get_bytes("x/y.json") == b"{}"


def test_local_writes_are_atomic_and_leave_no_temp_files(tmp_path):
    store = LocalFolderStore(tmp_path)
    store.put_bytes("d/obj", b"v1")
    # A writer that crashed mid-put leaves a temp file: invisible to list, never read as the object.
    (tmp_path / "d" / f".obj.deadbeef{TMP_SUFFIX}").write_bytes(b"half")
    assert [i.key for i in store.list()] == ["d/obj"]
    with pytest.raises(InvalidKey, match="reserved"):
        store.put_bytes(f"d/x{TMP_SUFFIX}", b"")
    store.copy("d/obj", "e/obj")
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["obj"]


def test_local_delete_prunes_empty_folders(tmp_path):
    store = LocalFolderStore(tmp_path / "r")
    store.put_bytes("a/b/c", b"")
    store.delete("a/b/c")
    assert list((tmp_path / "r").iterdir()) == []


# -- URIs ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("uri, expected", [
    ("s3://b/shards/manifest.json", ("s3://b/shards", "manifest.json")),
    ("s3://b/manifest.json", ("s3://b", "manifest.json")),
    ("file:///data/x/m.json", ("file:///data/x", "m.json")),
    ("file:///m.json", ("file:///", "m.json")),
    ("/data/x/m.json", ("/data/x", "m.json")),
    ("m.json", (".", "m.json")),
])
def test_split_uri(uri, expected):
    assert split_uri(uri) == expected


@pytest.mark.parametrize("uri", ["s3://bucket-only", "s3://b/dir/", "", "s3:///key"])
def test_split_uri_rejects_non_objects(uri):
    with pytest.raises(StoreConfigError):
        split_uri(uri)


def test_open_store_s3_forms():
    settings = S3Settings(endpoint="https://s3.example.com", access_key="k", secret_key="s")
    store = open_store("s3://bucket/some/prefix/", s3=settings)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.uri) == ("bucket", "some/prefix", "s3://bucket/some/prefix")
    assert open_store("s3://bucket", s3=settings).uri == "s3://bucket"


@pytest.mark.parametrize("uri, message", [
    ("gs://bucket/x", "unsupported store URI scheme"),
    ("s3:///prefix", "names no bucket"),
    ("s3://Bad_Bucket!/x", "bucket name"),
    ("file://otherhost/data", "must be local"),
    ("s3://bucket/a/../b", "prefix 'a/../b' is not usable"),
])
def test_open_store_rejects_bad_uris(uri, message):
    settings = S3Settings(endpoint="http://127.0.0.1:1", access_key="k", secret_key="s")
    with pytest.raises(StoreConfigError, match=message):
        open_store(uri, s3=settings)


# -- settings and configuration errors -------------------------------------------------------------

def test_s3_settings_from_env(monkeypatch):
    env = {"RINGFLOW_S3_ENDPOINT": "https://minio:9000", "AWS_ACCESS_KEY_ID": "id",
           "AWS_SECRET_ACCESS_KEY": "very-secret"}
    settings = S3Settings.from_env(env)
    assert (settings.host, settings.secure, settings.region) == ("minio:9000", True, None)
    assert "very-secret" not in repr(settings)
    assert S3Settings.from_env(env | {"AWS_DEFAULT_REGION": "eu-1",
                                      "RINGFLOW_S3_ENDPOINT": "http://m:9000"}).secure is False
    with pytest.raises(StoreConfigError, match="AWS_SECRET_ACCESS_KEY") as err:
        S3Settings.from_env({k: v for k, v in env.items() if k != "AWS_SECRET_ACCESS_KEY"})
    assert "AWS_ACCESS_KEY_ID" not in str(err.value)
    with pytest.raises(StoreConfigError, match="RINGFLOW_S3_ENDPOINT, AWS_ACCESS_KEY_ID"):
        S3Settings.from_env({"AWS_SECRET_ACCESS_KEY": "x"})
    with pytest.raises(StoreConfigError, match="RINGFLOW_S3_ENDPOINT"):
        S3Settings.from_env(env | {"RINGFLOW_S3_ENDPOINT": "minio:9000"})  # no scheme
    for var in ("RINGFLOW_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(StoreConfigError, match="RINGFLOW_S3_ENDPOINT"):
        open_store("s3://bucket/x")  # settings default to the environment


def test_s3_retry_and_timeout_settings(monkeypatch):
    base = {"RINGFLOW_S3_ENDPOINT": "http://m:9000", "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "s"}
    defaults = S3Settings.from_env(base)
    assert (defaults.max_attempts, defaults.connect_timeout, defaults.read_timeout) == (10, 10.0, 60.0)
    assert defaults.to_env() == base  # defaults are not spelled out in job environments
    tuned = S3Settings.from_env(base | {"RINGFLOW_S3_MAX_ATTEMPTS": "3", "RINGFLOW_S3_CONNECT_TIMEOUT": "2.5",
                                        "RINGFLOW_S3_READ_TIMEOUT": "7"})
    assert (tuned.max_attempts, tuned.connect_timeout, tuned.read_timeout) == (3, 2.5, 7.0)
    assert S3Settings.from_env(tuned.to_env()) == tuned  # a job process gets the same settings
    config = S3Store.from_settings("bucket", "", tuned)._client.meta.config
    assert config.retries == {"mode": "standard", "total_max_attempts": 3}
    assert (config.connect_timeout, config.read_timeout) == (2.5, 7.0)
    for var, value in (("RINGFLOW_S3_MAX_ATTEMPTS", "0"), ("RINGFLOW_S3_MAX_ATTEMPTS", "three"),
                       ("RINGFLOW_S3_READ_TIMEOUT", "-1"), ("RINGFLOW_S3_CONNECT_TIMEOUT", "soon")):
        with pytest.raises(StoreConfigError, match=f"fix {var}"):
            S3Settings.from_env(base | {var: value})


@pytest.mark.job
def test_open_store_reads_s3_settings_from_env(s3_server, monkeypatch):
    for var, value in s3_server.env().items():
        monkeypatch.setenv(var, value)
    store = open_store(f"s3://{s3_server.new_bucket()}/run")
    store.put_bytes("k", b"v")
    parent, name = split_uri(store.uri + "/k")
    assert open_store(parent).get_bytes(name) == b"v"


@pytest.mark.job
def test_unknown_bucket_is_a_config_error(s3_server):
    for region in (None, "us-east-1"):  # with no region the SDK asks the bucket's location first
        store = S3Store.from_settings("no-such-bucket", "p", s3_server.settings(region=region))
        for call in (lambda: store.put_bytes("k", b""), lambda: store.get_bytes("k"),
                     lambda: list(store.list()), lambda: store.exists("k"), store.check):
            with pytest.raises(StoreConfigError, match="bucket 'no-such-bucket' does not exist.*create it"):
                call()


@pytest.mark.job
def test_unreachable_endpoint_is_a_config_error():
    settings = S3Settings(endpoint=f"http://127.0.0.1:{_closed_port()}", access_key="k", secret_key="s",
                          region="us-east-1", max_attempts=2)  # retrying a closed port proves nothing more
    store = S3Store.from_settings("bucket", "", settings)
    with pytest.raises(StoreConfigError, match="cannot reach the S3 endpoint.*RINGFLOW_S3_ENDPOINT"):
        store.get_bytes("k")


@pytest.mark.job
def test_bad_credentials_are_config_errors(s3_server_with_auth):
    server = s3_server_with_auth
    bucket = server.new_bucket()
    good = S3Store.from_settings(bucket, "p", server.settings())
    good.put_bytes("k", b"v")
    assert good.get_bytes("k") == b"v"

    cases = [
        (dict(access_key="AKIAUNKNOWNKEY000000"), "does not know the access key: fix AWS_ACCESS_KEY_ID"),
        (dict(secret_key="wrong-secret"), "fix AWS_SECRET_ACCESS_KEY"),
        (dict(access_key=server.limited[0], secret_key=server.limited[1]), "access denied.*AWS_ACCESS_KEY_ID"),
    ]
    for overrides, message in cases:
        for region in (None, "us-east-1"):
            store = S3Store.from_settings(bucket, "p", server.settings(region=region, **overrides))
            for call in (lambda: store.get_bytes("k"), lambda: store.put_bytes("k2", b""),
                         lambda: list(store.list())):
                with pytest.raises(StoreConfigError, match=message):
                    call()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
