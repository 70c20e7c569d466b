"""The S3 clients a process builds (store/s3.py): botocore's models read once per process and shared (a rank
forked after load_models() builds its clients without reading them: an elastic DDP restart's ranks each build
theirs first thing), while each client keeps its own settings and credentials. Builds clients only: no request."""
import botocore.loaders

from ringflow.training.store import s3


def test_after_load_models_a_client_is_built_without_reading_a_model_file(monkeypatch):
    s3.load_models()
    read = []
    original = botocore.loaders.JSONFileLoader.load_file
    monkeypatch.setattr(botocore.loaders.JSONFileLoader, "load_file",
                        lambda self, path: read.append(path) or original(self, path))
    client = s3._client(s3.S3Settings("http://127.0.0.1:9", "reader", "secret-1"), -1)
    assert read == [] and client.meta.endpoint_url == "http://127.0.0.1:9"


def test_clients_share_the_models_not_the_credentials():
    a = s3._client(s3.S3Settings("http://127.0.0.1:9", "key-a", "secret-a", region="eu-west-1"), -2)
    b = s3._client(s3.S3Settings("http://127.0.0.1:10", "key-b", "secret-b"), -2)
    assert a._loader is b._loader  # one loader of the models
    assert a._request_signer._credentials.access_key == "key-a"
    assert b._request_signer._credentials.access_key == "key-b"
    assert (a.meta.region_name, b.meta.endpoint_url) == ("eu-west-1", "http://127.0.0.1:10")
