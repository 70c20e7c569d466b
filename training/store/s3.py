"""S3-compatible object storage (MinIO in the cluster, moto in tests) through the `minio` SDK.

Credentials come only from the environment (`S3Settings.from_env`): job configs and DAG code are
stored, logged and rendered in the Airflow UI, so a key written there would leak.

Every SDK or network failure that means "the configuration is wrong" (unknown key id, wrong secret,
missing bucket, unreachable endpoint) becomes a StoreConfigError naming the setting to fix, so a
failed task says what to change instead of printing an XML error body.
"""
from __future__ import annotations

import copy as _copy
import dataclasses
import io
import os
import urllib.parse
from typing import Iterator, Mapping

import certifi
import urllib3
from minio import Minio
from minio.commonconfig import CopySource
from minio.error import InvalidResponseError, S3Error
from minio.helpers import check_bucket_name

from .base import (ObjectInfo, ObjectNotFound, ObjectStore, StoreConfigError, check_key, check_prefix,
                   join_key)

ENDPOINT_VAR = "RINGFLOW_S3_ENDPOINT"
ACCESS_KEY_VAR = "AWS_ACCESS_KEY_ID"
SECRET_KEY_VAR = "AWS_SECRET_ACCESS_KEY"
REGION_VAR = "AWS_DEFAULT_REGION"

# Above this, uploads go multipart: a failed part is retried alone instead of the whole checkpoint.
DEFAULT_PART_SIZE = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class S3Settings:
    endpoint: str  # a URL, e.g. http://minio.data.svc:9000; the scheme decides TLS
    access_key: str
    secret_key: str = dataclasses.field(repr=False)  # never in logs or tracebacks
    region: str | None = None

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise StoreConfigError(
                f"S3 endpoint {self.endpoint!r} is not a URL like http://127.0.0.1:9000 or "
                f"https://s3.example.com: fix {ENDPOINT_VAR}"
            )

    @property
    def secure(self) -> bool:
        return urllib.parse.urlsplit(self.endpoint).scheme == "https"

    @property
    def host(self) -> str:
        """host:port, the form the minio SDK wants."""
        return urllib.parse.urlsplit(self.endpoint).netloc

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "S3Settings":
        env = os.environ if environ is None else environ
        missing = [v for v in (ENDPOINT_VAR, ACCESS_KEY_VAR, SECRET_KEY_VAR) if not env.get(v)]
        if missing:
            raise StoreConfigError(
                f"S3 storage needs {', '.join(missing)} set in the environment of this process "
                f"(credentials are never read from code or job configs)"
            )
        return cls(endpoint=env[ENDPOINT_VAR], access_key=env[ACCESS_KEY_VAR],
                   secret_key=env[SECRET_KEY_VAR], region=env.get(REGION_VAR) or None)

    def to_env(self) -> dict[str, str]:
        """The variables from_env reads: how a process started for a job gets these settings."""
        env = {ENDPOINT_VAR: self.endpoint, ACCESS_KEY_VAR: self.access_key, SECRET_KEY_VAR: self.secret_key}
        return env | ({REGION_VAR: self.region} if self.region else {})


def _http_client() -> urllib3.PoolManager:
    # The SDK's default waits 5 minutes to connect and retries 5 times: a wrong endpoint would hang
    # a task for half an hour before saying anything. Reads of big objects keep a long timeout.
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=10, read=300),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=urllib3.Retry(total=3, connect=2, backoff_factor=0.2,
                              status_forcelist=[500, 502, 503, 504]),
    )


class MinioStore(ObjectStore):
    def __init__(self, bucket: str, prefix: str = "", *, endpoint: str, access_key: str, secret_key: str,
                 secure: bool | None = None, region: str | None = None,
                 part_size: int = DEFAULT_PART_SIZE) -> None:
        if "://" in endpoint:  # accept the URL form too; its scheme decides TLS unless told otherwise
            parts = urllib.parse.urlsplit(endpoint)
            endpoint, secure = parts.netloc, (parts.scheme == "https") if secure is None else secure
        try:
            check_bucket_name(bucket)
        except ValueError as exc:
            raise StoreConfigError(f"bucket name {bucket!r} is invalid ({exc}): fix the s3:// URI") from exc
        try:
            if prefix.strip("/"):
                check_key(prefix.strip("/"))
        except ValueError as exc:
            raise StoreConfigError(f"prefix {prefix!r} is not usable ({exc}): fix the s3:// URI") from exc
        self._bucket = bucket
        self._prefix = prefix.strip("/")
        self._endpoint_url = f"{'https' if secure is not False else 'http'}://{endpoint}"
        self._part_size = part_size
        self._bucket_checked = False
        self._client = Minio(endpoint, access_key=access_key, secret_key=secret_key,
                             secure=secure is not False, region=region, http_client=_http_client())

    @classmethod
    def from_settings(cls, bucket: str, prefix: str = "", settings: S3Settings | None = None,
                      **kwargs) -> "MinioStore":
        s = settings or S3Settings.from_env()
        return cls(bucket, prefix, endpoint=s.host, access_key=s.access_key, secret_key=s.secret_key,
                   secure=s.secure, region=s.region, **kwargs)

    def __repr__(self) -> str:
        return f"MinioStore({self.uri!r}, endpoint={self._endpoint_url!r})"

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def uri(self) -> str:
        return f"s3://{join_key(self._bucket, self._prefix)}"

    def child(self, prefix: str) -> "MinioStore":
        if prefix.strip("/"):
            check_key(prefix.strip("/"))
        other = _copy.copy(self)  # shares the client and its connection pool
        other._prefix = join_key(self._prefix, prefix)
        return other

    def check(self) -> None:
        """Fail now, with a StoreConfigError, if the endpoint, credentials or bucket are wrong."""
        try:
            found = self._client.bucket_exists(self._bucket)
        except Exception as exc:
            raise self._translate(exc, "check the bucket") from exc
        if not found:
            raise self._no_bucket()
        self._bucket_checked = True

    # -- writes ---------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._errors("upload", key):
            self._client.put_object(self._bucket, self._name(key), io.BytesIO(data), len(data),
                                    part_size=self._part_size)

    def put_file(self, key: str, path: str) -> None:
        with self._errors("upload", key):
            self._client.fput_object(self._bucket, self._name(key), path, part_size=self._part_size)

    def copy(self, src_key: str, dst_key: str) -> None:
        with self._errors("copy", src_key):
            self._client.copy_object(self._bucket, self._name(dst_key),
                                     CopySource(self._bucket, self._name(src_key)))

    def delete(self, key: str) -> None:
        try:
            with self._errors("delete", key):
                self._client.remove_object(self._bucket, self._name(key))
        except ObjectNotFound:
            pass

    # -- reads ----------------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        with self._errors("download", key):
            response = self._client.get_object(self._bucket, self._name(key))
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

    def get_file(self, key: str, path: str) -> None:
        path = os.path.abspath(path)
        # The SDK downloads to "<path>.<etag>.part.minio" and renames, so a failed download never
        # leaves a truncated file at `path`.
        with self._errors("download", key):
            self._client.fget_object(self._bucket, self._name(key), path)

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except ObjectNotFound:
            return False
        return True

    def stat(self, key: str) -> ObjectInfo:
        with self._errors("stat", key):
            obj = self._client.stat_object(self._bucket, self._name(key))
        return ObjectInfo(key=key, size=int(obj.size or 0))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        root = f"{self._prefix}/" if self._prefix else ""
        found = []
        # Materialised inside the error guard: a lazy generator would raise SDK errors at the
        # caller's loop, untranslated.
        with self._errors("list", prefix or "/"):
            for obj in self._client.list_objects(self._bucket, prefix=root + prefix, recursive=True):
                name = obj.object_name
                if name.endswith("/"):  # folder markers some consoles create; not objects
                    continue
                found.append(ObjectInfo(key=name[len(root):], size=int(obj.size or 0)))
        found.sort(key=lambda info: info.key)
        return iter(found)

    # -- errors ---------------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        return join_key(self._prefix, check_key(key))

    def _errors(self, op: str, key: str) -> "_Translate":
        return _Translate(self, op, key)

    def _no_bucket(self) -> StoreConfigError:
        return StoreConfigError(
            f"bucket {self._bucket!r} does not exist at {self._endpoint_url}: create it "
            f"(e.g. `mc mb`), or fix the bucket in the store URI {self.uri}"
        )

    def _translate(self, exc: Exception, op: str, key: str = "") -> Exception:
        where = f"s3://{join_key(self._bucket, self._prefix, key)}"
        if isinstance(exc, S3Error):
            code = exc.code or ""
            if code == "NoSuchKey":
                return ObjectNotFound(f"{key!r} not found in {self.uri}")
            if code == "NoSuchBucket":
                return self._no_bucket()
            if code == "InvalidAccessKeyId":
                return StoreConfigError(
                    f"the S3 server at {self._endpoint_url} does not know the access key: "
                    f"fix {ACCESS_KEY_VAR} (and {SECRET_KEY_VAR})"
                )
            if code == "SignatureDoesNotMatch":
                return StoreConfigError(
                    f"the S3 server at {self._endpoint_url} rejected the request signature: "
                    f"fix {SECRET_KEY_VAR} (it does not belong to {ACCESS_KEY_VAR})"
                )
            if code in ("AuthorizationHeaderMalformed", "InvalidRegion", "IllegalLocationConstraintException"):
                return StoreConfigError(f"the S3 server rejected the region ({exc.message}): fix {REGION_VAR}")
            if code == "AccessDenied":
                # HEAD answers carry no error body, so bad credentials can also land here.
                return StoreConfigError(
                    f"access denied to {op} {where}: check {ACCESS_KEY_VAR} and {SECRET_KEY_VAR}, and "
                    f"that this user may access bucket {self._bucket!r}"
                )
            return exc
        if isinstance(exc, InvalidResponseError):
            return StoreConfigError(
                f"{self._endpoint_url} did not answer like an S3 server ({exc}): fix {ENDPOINT_VAR}"
            )
        if isinstance(exc, urllib3.exceptions.MaxRetryError) and not isinstance(
                exc.reason, urllib3.exceptions.ResponseError):
            return StoreConfigError(
                f"cannot reach the S3 endpoint {self._endpoint_url} ({exc.reason}): fix {ENDPOINT_VAR} "
                f"or start the server"
            )
        if isinstance(exc, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError,
                            urllib3.exceptions.SSLError)):
            return StoreConfigError(f"cannot reach the S3 endpoint {self._endpoint_url} ({exc}): fix {ENDPOINT_VAR}")
        return exc


class _Translate:
    """Context manager mapping SDK exceptions to the store's exceptions."""

    def __init__(self, store: MinioStore, op: str, key: str) -> None:
        self.store, self.op, self.key = store, op, key

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, (ObjectNotFound, StoreConfigError)):
            return False
        mapped = self.store._translate(exc, self.op, self.key)
        if isinstance(mapped, ObjectNotFound) and not self.store._bucket_checked:
            # A HEAD on an object in a missing bucket also answers "no such key" (no body to say
            # otherwise); look once so a typo in the bucket is not mistaken for an absent object.
            self.store.check()
        if mapped is exc:
            return False
        raise mapped from exc
