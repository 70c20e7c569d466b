"""S3Store's presigned URLs: signed for the object or folder they name, opened by a plain HTTP client (no
credentials, no SDK) against moto; a bad expiry or key is refused before anything is signed.

moto 5.2 does not check query-string signatures (with credentials enforced it answers a presigned URL with a
500: its IAM check reads only the Authorization header), so the server here is the permissive one and the
signature's parts are checked in the URL."""
from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

import pytest

from ringflow.training.store import S3Store, StoreConfigError
from ringflow.training.store.s3 import PRESIGN_MAX_SECONDS


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def store(s3_server):
    server = s3_server
    return S3Store.from_settings(server.new_bucket(), "team/ringflow", server.settings())


@pytest.mark.job
def test_presigned_get_opens_the_object_without_credentials(store):
    store.put_bytes("runs/d/r/health.png", b"\x89PNG plot")
    url = store.presigned_get("runs/d/r/health.png", 600)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert urllib.parse.urlsplit(url).path == f"/{store.bucket}/team/ringflow/runs/d/r/health.png"
    assert query["X-Amz-Expires"] == ["600"] and query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert query["X-Amz-Credential"][0].startswith(f"{store.settings.access_key}/") and "X-Amz-Signature" in query
    assert store.settings.secret_key not in url
    assert _get(url) == (200, b"\x89PNG plot")


@pytest.mark.job
def test_presigned_listing_lists_the_folder_only(store):
    for key in ("runs/d/r/health.png", "runs/d/r/checkpoints/ckpt-1/state.pt", "runs/d/other/health.png"):
        store.put_bytes(key, b"x")
    status, body = _get(store.presigned_listing("runs/d/r/", 600))
    assert status == 200, body
    text = body.decode()
    assert "team/ringflow/runs/d/r/health.png" in text and "runs/d/r/checkpoints/ckpt-1/state.pt" in text
    assert "runs/d/other" not in text


@pytest.mark.parametrize("expires", [0, -1, PRESIGN_MAX_SECONDS + 1, 1.5, True, "600"])
def test_an_expiry_sigv4_refuses_is_refused_before_signing(expires):
    from ringflow.training.store import S3Settings

    store = S3Store("bucket-a", "p", S3Settings(endpoint="http://127.0.0.1:9", access_key="k", secret_key="s"))
    with pytest.raises(StoreConfigError, match="7 days"):
        store.presigned_get("runs/x/health.png", expires)


def test_presigning_checks_the_key_like_every_other_call():
    from ringflow.training.store import InvalidKey, S3Settings

    store = S3Store("bucket-a", "p", S3Settings(endpoint="http://127.0.0.1:9", access_key="k", secret_key="s"))
    with pytest.raises(InvalidKey):
        store.presigned_get("../other-team/secret", 60)
    with pytest.raises(InvalidKey):
        store.presigned_listing("runs/../../x", 60)
