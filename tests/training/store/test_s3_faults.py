"""Transient S3 faults are retried with backoff and lose nothing; lasting ones fail clearly.

Faults come from tests/s3_fault_proxy.py between the store and moto's server: 5xx answers, reset
connections (after the server did the work, so the client cannot know whether a write landed) and
answers slower than the read timeout. Each test asserts from the proxy's log that its faults really
happened, so a rule that stopped matching cannot turn a test into one that proves nothing.
"""
from __future__ import annotations

import hashlib
import os

import pytest

from ringflow.training.formats.checkpoint import CheckpointStore
from ringflow.training.store import PreconditionFailed, S3Store, StoreUnavailable

pytestmark = pytest.mark.job

MIB = 1024 * 1024
PART = 5 * MIB  # S3's smallest part: big objects go multipart in a few parts without big test data


def _store(s3_server, proxy, *, max_attempts: int = 4, read_timeout: float = 1.0, part_size: int = PART) -> S3Store:
    settings = s3_server.settings(endpoint=proxy.endpoint, max_attempts=max_attempts, read_timeout=read_timeout)
    return S3Store.from_settings(s3_server.new_bucket(), "run", settings, part_size=part_size)


def _all_served(proxy) -> None:
    assert proxy.pending() == [], f"rules never matched (the code under test changed?): {proxy.pending()}\n{[(e.method, e.target) for e in proxy.log]}"


def test_small_objects_survive_5xx_resets_and_slow_answers(s3_server, fault_proxy):
    store = _store(s3_server, fault_proxy)
    fault_proxy.fail("PUT", r"/run/a$", times=2, status=503)
    fault_proxy.reset("PUT", r"/run/a$", times=1)  # the write landed; the answer was lost
    store.put_bytes("a", b"payload-a")
    fault_proxy.fail("GET", r"/run/a$", times=1, status=500)
    fault_proxy.reset("GET", r"/run/a$", times=1)  # cut mid-body: botocore leaves this retry to us
    fault_proxy.delay("GET", r"/run/a$", seconds=2.5, times=1)  # past the 1 s read timeout
    assert store.get_bytes("a") == b"payload-a"
    fault_proxy.fail("HEAD", r"/run/a$", times=1, status=502)
    fault_proxy.delay("HEAD", r"/run/a$", seconds=2.5, times=1)
    assert store.exists("a") and store.stat("a").size == len(b"payload-a")
    fault_proxy.fail("PUT", r"/run/b$", times=1, status=503, header=r"^x-amz-copy-source:")  # the copy
    fault_proxy.reset("PUT", r"/run/b$", times=1, header=r"^x-amz-copy-source: \S+/run/a$")
    store.copy("a", "b")
    fault_proxy.fail("GET", r"list-type=2", times=1, status=503)
    fault_proxy.reset("GET", r"list-type=2", times=1)
    fault_proxy.delay("GET", r"list-type=2", seconds=2.5, times=1)
    assert [i.key for i in store.list()] == ["a", "b"]
    fault_proxy.fail("DELETE", r"/run/b$", times=1, status=503)
    fault_proxy.reset("DELETE", r"/run/b$", times=1)
    store.delete("b")
    _all_served(fault_proxy)
    assert [i.key for i in store.list()] == ["a"] and store.get_bytes("a") == b"payload-a"
    assert fault_proxy.faults() == 15
    # Every faulted request was followed by one that went through.
    assert fault_proxy.requests("PUT", r"/run/a$", status=200) and fault_proxy.requests("DELETE", status=204)


def test_multipart_upload_download_and_copy_survive_faults(s3_server, fault_proxy, tmp_path):
    store = _store(s3_server, fault_proxy)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(2 * PART + MIB))  # three parts
    fault_proxy.fail("PUT", r"/run/big\?uploadId=.*partNumber=2$", times=2, status=503)
    fault_proxy.reset("PUT", r"/run/big\?uploadId=.*partNumber=3$", times=1)
    fault_proxy.fail("POST", r"/run/big\?uploadId=", times=1, status=500)  # completing the upload
    store.put_file("big", str(src))
    head = store._client.head_object(Bucket=store.bucket, Key="run/big")
    assert head["ETag"].strip('"').endswith("-3") and head["ContentLength"] == src.stat().st_size

    fault_proxy.fail("HEAD", r"/run/big$", times=1, status=503)
    fault_proxy.reset("GET", r"/run/big$", times=2)  # ranged GETs cut mid-body
    fault_proxy.delay("GET", r"/run/big$", seconds=2.5, times=1)
    dst = tmp_path / "down" / "big.out"
    store.get_file("big", str(dst))
    assert hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
    assert os.listdir(dst.parent) == ["big.out"]

    fault_proxy.fail("PUT", r"/run/big-copy\?uploadId=.*partNumber=1$", times=1, status=503)  # UploadPartCopy
    store.copy("big", "big-copy")
    assert store.stat("big-copy").size == src.stat().st_size
    _all_served(fault_proxy)
    assert fault_proxy.faults() == 9


def test_conditional_writes_whose_answer_was_lost_still_count_once(s3_server, fault_proxy):
    """The create landed but its answer was cut; the retry meets our own object (412). The store
    sees its own content there and reports the win, not a false 'someone else was first'."""
    store = _store(s3_server, fault_proxy)
    fault_proxy.reset("PUT", r"/run/versions/1$", times=1)
    etag = store.put_bytes_if_absent("versions/1", b"claimed-by-a")
    assert store.get_bytes_tagged("versions/1") == (b"claimed-by-a", etag)
    with pytest.raises(PreconditionFailed):  # and a real second creator still loses
        store.put_bytes_if_absent("versions/1", b"claimed-by-b")

    fault_proxy.delay("PUT", r"/run/versions/1$", seconds=2.5, times=1)  # replace lands, answer too late
    new = store.put_bytes_if_match("versions/1", b"moved-by-a", etag)
    assert store.get_bytes_tagged("versions/1") == (b"moved-by-a", new)
    with pytest.raises(PreconditionFailed):
        store.put_bytes_if_match("versions/1", b"moved-by-b", etag)  # stale etag
    _all_served(fault_proxy)
    assert [e.status for e in fault_proxy.requests("PUT", r"/run/versions/1$")] == [None, 412, 412, 200, 412, 412]


@pytest.mark.parametrize("fault, message", [
    ("fail", r"failed after 3 attempts \(HTTP 503 SlowDown\)"),
    ("delay", r"failed after 3 attempts \(no answer within 1s\)"),
    ("reset", r"failed after 3 attempts \(connection broke"),
])
def test_lasting_faults_say_what_failed_and_what_to_check(s3_server, fault_proxy, fault, message):
    store = _store(s3_server, fault_proxy, max_attempts=3)
    store.put_bytes("k", b"v")
    rule = dict(fail=fault_proxy.fail, delay=lambda *a, **k: fault_proxy.delay(*a, seconds=1.5, **k),
                reset=fault_proxy.reset)[fault]
    rule("*", r"/run/k$", times=None)
    for call, op in ((lambda: store.get_bytes("k"), "download"), (lambda: store.put_bytes("k", b"w"), "upload")):
        with pytest.raises(StoreUnavailable, match=message) as err:
            call()
        text = str(err.value)
        assert text.startswith(f"{op} of s3://{store.bucket}/run/k failed")
        assert f"S3 server at {fault_proxy.endpoint} is up" in text
        assert "RINGFLOW_S3_READ_TIMEOUT (now 1s)" in text and "RINGFLOW_S3_MAX_ATTEMPTS (now 3)" in text
    assert len(fault_proxy.requests("GET", r"/run/k$")) == 3  # tried exactly max_attempts times
    assert len(fault_proxy.requests("PUT", r"/run/k$")) == 4  # the setup put + 3 attempts


def test_checkpoint_save_retries_transient_faults(s3_server, fault_proxy):
    ckpts = CheckpointStore(_store(s3_server, fault_proxy))
    fault_proxy.fail("PUT", r"/ckpt-000000010/state.pt$", times=2, status=503)
    fault_proxy.reset("PUT", r"/ckpt-000000010/MANIFEST.json$", times=1)
    ckpts.save(10, {"state.pt": b"weights-10"}, {"loss": 0.5})
    _all_served(fault_proxy)
    assert ckpts.latest_valid().files == {"state.pt": b"weights-10"}


@pytest.mark.parametrize("size", [1024, PART + MIB], ids=["single-put", "multipart"])
def test_checkpoint_upload_failing_for_good_keeps_the_previous_resume_point(s3_server, fault_proxy, size):
    store = _store(s3_server, fault_proxy, max_attempts=3)
    ckpts = CheckpointStore(store)
    ckpts.save(10, {"state.pt": b"a" * size}, {"step": 10})
    fault_proxy.fail("PUT", r"/ckpt-000000020/", times=None, status=503)  # every upload to the new one
    with pytest.raises(StoreUnavailable, match=r"upload of s3://.*/run/checkpoints/ckpt-000000020/state\.pt "
                                               r"failed after 3 attempts \(HTTP 503 SlowDown\): check"):
        ckpts.save(20, {"state.pt": b"b" * size}, {"step": 20})
    assert fault_proxy.faults("PUT", r"/ckpt-000000020/") >= 3
    fault_proxy.clear()  # the server is back: a restarted job looks for where to resume
    resumed = CheckpointStore(store).latest_valid()
    assert resumed is not None and resumed.step == 10 and resumed.files == {"state.pt": b"a" * size}
    assert CheckpointStore(store).names() == ["ckpt-000000010"]
    # A multipart upload that failed is aborted, not left to be billed and listed.
    assert store._client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []
