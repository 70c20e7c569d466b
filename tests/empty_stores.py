"""An empty store of each kind, for the fixtures that give one (tests/conftest.py, the store contract)."""
from __future__ import annotations


def empty_store(kind: str, request, tmp_path):
    """An empty store of `kind` ("local" or "s3"). The S3 one sits under a prefix of a fresh bucket, so keys are
    always relative to a store root that is not the bucket root."""
    if kind == "local":
        from ringflow.training.store import LocalFolderStore

        return LocalFolderStore(tmp_path / "store")
    from ringflow.training.store import S3Store

    server = request.getfixturevalue("s3_server")
    return S3Store.from_settings(server.new_bucket(), "run-1", server.settings())
