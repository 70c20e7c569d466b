"""S3-compatible object storage (MinIO in the cluster, moto in tests) through boto3.

Why boto3, not the `minio` SDK: concurrent promoters need conditional writes (`If-None-Match: *` to
claim a version, `If-Match: <etag>` to move a pointer by compare-and-swap), and minio 7.2 has no
public way to send them on `put_object`, while boto3's `put_object(IfNoneMatch=, IfMatch=)` does.
Keeping two SDKs would mean two retry policies, two error vocabularies and two connection pools, so
the whole store moved to one boto3 client: botocore's "standard" retry mode retries 5xx, throttling,
reset connections and read timeouts with exponential backoff and full jitter, and s3transfer does
managed multipart uploads (a failed part is retried alone), downloads that retry a broken stream
and land through a temporary file, and server-side copies. Streaming reads that break after the
headers arrived are the one case botocore does not retry; `get_bytes` retries those itself.

Credentials come only from the environment (`S3Settings.from_env`): job configs and DAG code are
stored, logged and rendered in the Airflow UI, so a key written there would leak.

Every failure that means "the configuration is wrong" (unknown key id, wrong secret, missing bucket,
unreachable endpoint) becomes a StoreConfigError naming the setting to fix; a server that keeps
failing after every retry becomes StoreUnavailable saying what failed and what to check, instead of
an XML error body.
"""
from __future__ import annotations

import copy as _copy
import dataclasses
import functools
import io
import logging
import os
import random
import re
import time
import urllib.parse
from typing import Any, Iterator, Mapping

import boto3
import botocore.config
import botocore.loaders
import botocore.session
import botocore.exceptions as bx
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.parsers import ResponseParserError
from s3transfer.subscribers import BaseSubscriber

from .base import (ObjectInfo, ObjectNotFound, ObjectStore, PreconditionFailed, Progress, StoreConfigError,
                   StoreUnavailable, check_key, check_prefix, check_range, join_key, short_range)

ENDPOINT_VAR = "RINGFLOW_S3_ENDPOINT"
ACCESS_KEY_VAR = "AWS_ACCESS_KEY_ID"
SECRET_KEY_VAR = "AWS_SECRET_ACCESS_KEY"
REGION_VAR = "AWS_DEFAULT_REGION"
MAX_ATTEMPTS_VAR = "RINGFLOW_S3_MAX_ATTEMPTS"
CONNECT_TIMEOUT_VAR = "RINGFLOW_S3_CONNECT_TIMEOUT"
READ_TIMEOUT_VAR = "RINGFLOW_S3_READ_TIMEOUT"

# Every request is tried up to this many times. botocore's standard mode waits a random time in
# [0, min(b * 2**(n-1), 20 s)) before retry n, with b = 1 s after throttling (503 SlowDown) and
# b = 50 ms after other errors (5xx, resets, timeouts): ten attempts ride out up to ~25 s of errors
# (about 13 s on average: a MinIO pod restart, a load balancer failover) and ~110 s of throttling,
# without hiding a server that is down for good. Its retry quota (500 tokens per client, 5 per
# throttled and 14 per other retry, refilled by successes) makes a long outage fail fast instead.
DEFAULT_MAX_ATTEMPTS = 10
# Seconds to open a connection; a wrong endpoint fails within max_attempts times this.
DEFAULT_CONNECT_TIMEOUT = 10.0
# Seconds of silence while waiting for the next bytes of an answer (not for a whole transfer): an
# S3 server answers within seconds even for big objects, so longer means a stuck connection.
DEFAULT_READ_TIMEOUT = 60.0
_DEFAULT_REGION = "us-east-1"  # what MinIO and moto expect when none is configured
# Our own retries of broken GET bodies back off like botocore does after a non-throttling error.
_STREAM_BACKOFF_BASE, _MAX_BACKOFF = 0.05, 20.0

# A streamed GET body is read this much at a time, so a watcher sees its bytes arrive.
_READ_CHUNK = 1 << 20

# Above this, uploads go multipart: a failed part is retried alone instead of the whole checkpoint.
DEFAULT_PART_SIZE = 16 * 1024 * 1024
_TRANSFER_THREADS = 4

# A GET whose body breaks after the headers arrived; botocore only retries up to the headers.
_STREAM_ERRORS = (bx.ResponseStreamingError, bx.IncompleteReadError, bx.ReadTimeoutError,
                  bx.ConnectionClosedError, ConnectionError, TimeoutError)
# The longest a presigned URL may live: SigV4 signatures allow at most 7 days.
PRESIGN_MAX_SECONDS = 7 * 24 * 3600
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class S3Settings:
    endpoint: str  # a URL, e.g. http://minio.data.svc:9000; the scheme decides TLS
    access_key: str
    secret_key: str = dataclasses.field(repr=False)  # never in logs or tracebacks
    region: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise StoreConfigError(
                f"S3 endpoint {self.endpoint!r} is not a URL like http://127.0.0.1:9000 or "
                f"https://s3.example.com: fix {ENDPOINT_VAR}"
            )
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise StoreConfigError(f"S3 max_attempts must be an integer of at least 1, got {self.max_attempts!r}: "
                                   f"fix {MAX_ATTEMPTS_VAR}")
        for name, var in (("connect_timeout", CONNECT_TIMEOUT_VAR), ("read_timeout", READ_TIMEOUT_VAR)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise StoreConfigError(f"S3 {name} must be a positive number of seconds, got {value!r}: fix {var}")

    @property
    def secure(self) -> bool:
        return urllib.parse.urlsplit(self.endpoint).scheme == "https"

    @property
    def host(self) -> str:
        """host:port of the endpoint."""
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
        tuning: dict[str, Any] = {}
        for field, var, kind in (("max_attempts", MAX_ATTEMPTS_VAR, int),
                                 ("connect_timeout", CONNECT_TIMEOUT_VAR, float),
                                 ("read_timeout", READ_TIMEOUT_VAR, float)):
            if env.get(var):
                try:
                    tuning[field] = kind(env[var])
                except ValueError:
                    raise StoreConfigError(f"{var}={env[var]!r} is not a {kind.__name__}: fix {var}") from None
        return cls(endpoint=env[ENDPOINT_VAR], access_key=env[ACCESS_KEY_VAR],
                   secret_key=env[SECRET_KEY_VAR], region=env.get(REGION_VAR) or None, **tuning)

    def to_env(self) -> dict[str, str]:
        """The variables from_env reads: how a process started for a job gets these settings.
        Retry and timeout variables appear only when they differ from the defaults."""
        env = {ENDPOINT_VAR: self.endpoint, ACCESS_KEY_VAR: self.access_key, SECRET_KEY_VAR: self.secret_key}
        if self.region:
            env[REGION_VAR] = self.region
        for field, var in (("max_attempts", MAX_ATTEMPTS_VAR), ("connect_timeout", CONNECT_TIMEOUT_VAR),
                           ("read_timeout", READ_TIMEOUT_VAR)):
            value = getattr(self, field)
            if value != S3Settings.__dataclass_fields__[field].default:
                env[var] = str(value)
        return env


@functools.lru_cache(maxsize=16)
def _client(settings: S3Settings, pid: int) -> Any:
    """One client (and connection pool) per settings and process: clients are thread-safe but must
    not cross a fork, hence the pid in the cache key. Building one costs ~50 ms of model loading."""
    del pid
    config = botocore.config.Config(
        retries={"mode": "standard", "total_max_attempts": settings.max_attempts},  # the first try included
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        max_pool_connections=2 * _TRANSFER_THREADS + 2,
        signature_version="s3v4",
        s3={"addressing_style": "path"},  # MinIO and moto behind a plain host:port
        # Newer botocore adds CRC trailers to every upload by default, which older S3-compatible
        # servers reject; the checkpoint manifest carries its own sha256 anyway.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    core = botocore.session.Session()
    loader = _model_loader()
    core.register_component("data_loader", loader)
    session = boto3.session.Session(botocore_session=core, aws_access_key_id=settings.access_key,
                                    aws_secret_access_key=settings.secret_key,
                                    region_name=settings.region or _DEFAULT_REGION)
    loader.search_paths[:] = list(dict.fromkeys(loader.search_paths))  # boto3 adds its own folder per session
    ca_bundle = os.environ.get("AWS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
    return session.client("s3", endpoint_url=settings.endpoint.rstrip("/"), config=config,
                          verify=ca_bundle or True)


@functools.lru_cache(maxsize=1)
def _model_loader() -> Any:
    """botocore's loader of its models (S3's API, endpoints, retries), shared by every client this process
    builds: it keeps what it read, so a client after the first is built in ~7 ms, not ~50 ms. Plain data, so a
    process forked after load_models() inherits it loaded (rank/forked_torchrun.py)."""
    return botocore.loaders.create_loader(botocore.session.Session().get_config_variable("data_path"))


def load_models() -> None:
    """Read what building a client reads, now: a rank forked from this process (an elastic DDP restart, whose
    every worker opens its stores first thing) then builds its clients without reading the models again.
    Builds one client for a dummy endpoint, which sends nothing."""
    _client(S3Settings("http://127.0.0.1:9", "load-models", "load-models"), os.getpid())


class S3Store(ObjectStore):
    def __init__(self, bucket: str, prefix: str = "", settings: S3Settings | None = None, *,
                 part_size: int = DEFAULT_PART_SIZE) -> None:
        if not _BUCKET_RE.match(bucket or "") or ".." in bucket:
            raise StoreConfigError(f"bucket name {bucket!r} is invalid (3-63 lowercase letters, digits, '.' "
                                   f"and '-'): fix the s3:// URI")
        try:
            if prefix.strip("/"):
                check_key(prefix.strip("/"))
        except ValueError as exc:
            raise StoreConfigError(f"prefix {prefix!r} is not usable ({exc}): fix the s3:// URI") from exc
        self._settings = settings or S3Settings.from_env()
        self._bucket = bucket
        self._prefix = prefix.strip("/")
        self._part_size = part_size
        self._bucket_checked = False
        self._client = _client(self._settings, os.getpid())

    @classmethod
    def from_settings(cls, bucket: str, prefix: str = "", settings: S3Settings | None = None,
                      **kwargs) -> "S3Store":
        return cls(bucket, prefix, settings, **kwargs)

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, endpoint={self._settings.endpoint!r})"

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def settings(self) -> S3Settings:
        return self._settings

    @property
    def uri(self) -> str:
        return f"s3://{join_key(self._bucket, self._prefix)}"

    def child(self, prefix: str) -> "S3Store":
        if prefix.strip("/"):
            check_key(prefix.strip("/"))
        other = _copy.copy(self)  # shares the client and its connection pool
        other._prefix = join_key(self._prefix, prefix)
        return other

    def check(self) -> None:
        """Fail now, with a StoreConfigError, if the endpoint, credentials or bucket are wrong."""
        try:
            self._client.head_bucket(Bucket=self._bucket)
        except bx.ClientError as exc:
            if _code(exc) in ("404", "NoSuchBucket", "NotFound"):
                raise self._no_bucket() from exc
            raise self._translate(exc, "check the bucket") from exc
        except Exception as exc:
            raise self._translate(exc, "check the bucket") from exc
        self._bucket_checked = True

    # -- writes ---------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        name = self._name(key)
        with self._errors("upload", key):
            if len(data) < self._part_size:
                self._client.put_object(Bucket=self._bucket, Key=name, Body=bytes(data))
            else:
                with self._transfers() as manager:
                    manager.upload(io.BytesIO(data), self._bucket, name).result()

    def put_file(self, key: str, path: str, *, progress: Progress | None = None) -> None:
        name = self._name(key)
        with self._errors("upload", key), self._transfers() as manager:
            manager.upload(os.path.abspath(path), self._bucket, name, subscribers=_subscribers(progress)).result()

    def copy(self, src_key: str, dst_key: str) -> None:
        dst = self._name(dst_key)
        with self._errors("copy", src_key), self._transfers() as manager:
            manager.copy({"Bucket": self._bucket, "Key": self._name(src_key)}, self._bucket, dst).result()

    def delete(self, key: str) -> None:
        try:
            with self._errors("delete", key):
                self._client.delete_object(Bucket=self._bucket, Key=self._name(key))
        except ObjectNotFound:
            pass

    def put_bytes_if_absent(self, key: str, data: bytes) -> str:
        return self._put_conditional(key, bytes(data), {"IfNoneMatch": "*"})

    def put_bytes_if_match(self, key: str, data: bytes, etag: str) -> str:
        if not isinstance(etag, str) or not etag:
            raise ValueError(f"etag must be the non-empty string get_bytes_tagged returned, got {etag!r}")
        return self._put_conditional(key, bytes(data), {"IfMatch": etag})

    def _put_conditional(self, key: str, data: bytes, condition: dict[str, str]) -> str:
        name = self._name(key)
        try:
            with self._errors("conditional upload", key):
                try:
                    return self._client.put_object(Bucket=self._bucket, Key=name, Body=data, **condition)["ETag"]
                except bx.ClientError as exc:
                    retried = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) > 0
                    if not (retried and _is_precondition(exc)):
                        raise
            # An earlier attempt may have landed with its answer lost (reset, timeout, 5xx after the
            # write): the retry then meets our own write. Same content means it was ours.
            current, etag = self.get_bytes_tagged(key)
            if current == data:
                log.info("conditional upload of %s: an earlier attempt landed; keeping it", name)
                return etag
            raise PreconditionFailed(f"{key!r} in {self.uri}: another writer got there first")
        except ObjectNotFound as exc:  # If-Match on a missing key answers 404
            raise PreconditionFailed(f"{key!r} does not exist in {self.uri}") from exc

    # -- reads ----------------------------------------------------------------------------------

    def get_bytes(self, key: str, *, progress: Progress | None = None) -> bytes:
        return self._get(key, None, progress)[0]

    def get_bytes_tagged(self, key: str) -> tuple[bytes, str]:
        return self._get(key, None, None)

    def get_range(self, key: str, start: int, length: int, *, progress: Progress | None = None) -> bytes:
        check_range(key, start, length)
        data = self._get(key, (start, length), progress)[0]
        if len(data) != length:
            raise short_range(key, start, length, len(data))
        return data

    def _get(self, key: str, byte_range: tuple[int, int] | None, progress: Progress | None) -> tuple[bytes, str]:
        """The object (or `byte_range`: start, length) and its etag. A body that breaks off after the headers
        is asked for again, from the first byte not yet received (botocore retries only up to the headers)."""
        name = self._name(key)
        received: list[bytes] = []
        have, etag = 0, ""
        with self._errors("download", key):
            for attempt in range(1, self._settings.max_attempts + 1):
                extra = {}
                if byte_range is not None:
                    start, length = byte_range
                    extra["Range"] = f"bytes={start + have}-{start + length - 1}"
                elif have:
                    extra["Range"] = f"bytes={have}-"
                response = self._client.get_object(Bucket=self._bucket, Key=name, **extra)
                if have and received and response.get("ETag") != etag:
                    received, have = [], 0  # the object changed between two tries: start over
                    response["Body"].close()
                    continue
                etag = response["ETag"]
                try:
                    body = response["Body"]
                    while chunk := body.read(_READ_CHUNK):
                        received.append(chunk)
                        have += len(chunk)
                        if progress is not None:
                            progress(len(chunk))
                    return b"".join(received), etag
                except _STREAM_ERRORS as exc:
                    if attempt == self._settings.max_attempts:
                        raise
                    delay = random.random() * min(_STREAM_BACKOFF_BASE * 2 ** (attempt - 1), _MAX_BACKOFF)
                    log.warning("download of %s broke off after %d bytes (%s); retrying in %.1fs (attempt %d "
                                "of %d)", name, have, exc, delay, attempt + 1, self._settings.max_attempts)
                    time.sleep(delay)
                finally:
                    response["Body"].close()
        raise AssertionError("unreachable")

    def get_file(self, key: str, path: str, *, progress: Progress | None = None) -> None:
        path = os.path.abspath(path)
        name = self._name(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # s3transfer downloads to "<path>.<random>" and renames, so a failed download never leaves
        # a truncated file at `path`; a broken stream is retried from where it stopped.
        with self._errors("download", key), self._transfers() as manager:
            manager.download(self._bucket, name, path, subscribers=_subscribers(progress)).result()

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except ObjectNotFound:
            return False
        return True

    def stat(self, key: str) -> ObjectInfo:
        with self._errors("stat", key):
            head = self._client.head_object(Bucket=self._bucket, Key=self._name(key))
        return ObjectInfo(key=key, size=int(head.get("ContentLength") or 0))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        root = f"{self._prefix}/" if self._prefix else ""
        found = []
        # Materialised inside the error guard: a lazy generator would raise SDK errors at the
        # caller's loop, untranslated.
        with self._errors("list", prefix or "/"):
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self._bucket,
                                                                          Prefix=root + prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    name = obj["Key"]
                    if name.endswith("/"):  # folder markers some consoles create; not objects
                        continue
                    found.append(ObjectInfo(key=name[len(root):], size=int(obj.get("Size") or 0)))
        found.sort(key=lambda info: info.key)
        return iter(found)

    # -- presigned URLs: what a browser opens without credentials ---------------------------------

    def presigned_get(self, key: str, expires_seconds: int) -> str:
        """A URL that GETs the object `key` for `expires_seconds`, for whoever holds it. Signed locally
        (no request is sent); it works where the endpoint resolves, so a browser needs the same host."""
        return self._presign("get_object", {"Key": self._name(key)}, expires_seconds)

    def presigned_listing(self, prefix: str, expires_seconds: int) -> str:
        """A URL that lists the keys under `prefix` (ListObjectsV2, an XML document) for `expires_seconds`:
        a folder has no object of its own to sign."""
        folder = self._name(prefix.strip("/")) if prefix.strip("/") else self._prefix
        return self._presign("list_objects_v2", {"Prefix": f"{folder}/" if folder else ""}, expires_seconds)

    def _presign(self, operation: str, params: dict[str, str], expires_seconds: int) -> str:
        # SigV4 refuses more than 7 days; a longer expiry would only fail when someone clicks the link.
        if isinstance(expires_seconds, bool) or not isinstance(expires_seconds, int) \
                or not 1 <= expires_seconds <= PRESIGN_MAX_SECONDS:
            raise StoreConfigError(f"a presigned URL must expire in 1..{PRESIGN_MAX_SECONDS} seconds (7 days, "
                                   f"SigV4's limit), got {expires_seconds!r}: pick an expiry in that range")
        return self._client.generate_presigned_url(operation, Params={"Bucket": self._bucket, **params},
                                                   ExpiresIn=expires_seconds)

    # -- helpers --------------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        return join_key(self._prefix, check_key(key))

    def _transfers(self):
        config = TransferConfig(multipart_threshold=self._part_size, multipart_chunksize=self._part_size,
                                max_concurrency=_TRANSFER_THREADS,
                                num_download_attempts=self._settings.max_attempts,
                                preferred_transfer_client="classic")
        return create_transfer_manager(self._client, config)

    def _errors(self, op: str, key: str) -> "_Translate":
        return _Translate(self, op, key)

    def _no_bucket(self) -> StoreConfigError:
        return StoreConfigError(
            f"bucket {self._bucket!r} does not exist at {self._settings.endpoint}: create it "
            f"(e.g. `mc mb`), or fix the bucket in the store URI {self.uri}"
        )

    def _gave_up(self, op: str, where: str, what: str, attempts: int | None = None) -> StoreUnavailable:
        s = self._settings
        return StoreUnavailable(
            f"{op} of {where} failed after {attempts or s.max_attempts} attempts ({what}): check that the S3 server at "
            f"{s.endpoint} is up and healthy (its logs, disk space, load) and the network to it; if it is only "
            f"slow, raise {READ_TIMEOUT_VAR} (now {s.read_timeout:g}s) or {MAX_ATTEMPTS_VAR} (now {s.max_attempts})",
            where=where
        )

    def _translate(self, exc: Exception, op: str, key: str = "") -> Exception:
        where = f"s3://{join_key(self._bucket, self._prefix, key)}"
        endpoint = self._settings.endpoint
        if isinstance(exc, bx.ClientError):
            code = _code(exc)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFound(f"{key!r} not found in {self.uri}")
            if _is_precondition(exc):
                return PreconditionFailed(f"{key!r} in {self.uri} exists already or changed since it was read")
            if code == "NoSuchBucket":
                return self._no_bucket()
            if code == "InvalidAccessKeyId":
                return StoreConfigError(
                    f"the S3 server at {endpoint} does not know the access key: "
                    f"fix {ACCESS_KEY_VAR} (and {SECRET_KEY_VAR})"
                )
            if code == "SignatureDoesNotMatch":
                return StoreConfigError(
                    f"the S3 server at {endpoint} rejected the request signature: "
                    f"fix {SECRET_KEY_VAR} (it does not belong to {ACCESS_KEY_VAR})"
                )
            if code in ("AuthorizationHeaderMalformed", "InvalidRegion", "IllegalLocationConstraintException"):
                message = exc.response.get("Error", {}).get("Message", code)
                return StoreConfigError(f"the S3 server rejected the region ({message}): fix {REGION_VAR}")
            if code in ("AccessDenied", "403", "Forbidden"):
                # HEAD answers carry no error body, so bad credentials can also land here.
                return StoreConfigError(
                    f"access denied to {op} {where}: check {ACCESS_KEY_VAR} and {SECRET_KEY_VAR}, and "
                    f"that this user may access bucket {self._bucket!r}"
                )
            if status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout", "InternalError"):
                # Fewer attempts than configured when botocore's retry quota ran dry (a long outage).
                attempts = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) + 1
                return self._gave_up(op, where, f"HTTP {status} {code}", attempts)
            return exc
        if isinstance(exc, bx.EndpointConnectionError) and not isinstance(exc, bx.ConnectTimeoutError):
            return StoreConfigError(f"cannot reach the S3 endpoint {endpoint} ({exc}): fix {ENDPOINT_VAR} "
                                    f"or start the server")
        if isinstance(exc, bx.ConnectTimeoutError):
            return StoreConfigError(f"cannot reach the S3 endpoint {endpoint} within {self._settings.connect_timeout:g}s "
                                    f"({self._settings.max_attempts} attempts): fix {ENDPOINT_VAR}, or the network "
                                    f"or firewall between here and the server")
        if isinstance(exc, bx.SSLError):
            return StoreConfigError(f"TLS with the S3 endpoint {endpoint} failed ({exc}): fix {ENDPOINT_VAR} "
                                    f"(http or https?) or set SSL_CERT_FILE to the CA bundle that signed its certificate")
        if isinstance(exc, ResponseParserError):
            return StoreConfigError(f"{endpoint} did not answer like an S3 server ({exc}): fix {ENDPOINT_VAR}")
        if isinstance(exc, bx.ReadTimeoutError):
            return self._gave_up(op, where, f"no answer within {self._settings.read_timeout:g}s")
        if isinstance(exc, _STREAM_ERRORS):
            return self._gave_up(op, where, f"connection broke: {exc}")
        return exc


class _ProgressSubscriber(BaseSubscriber):
    def __init__(self, progress: Progress) -> None:
        self._progress = progress

    def on_progress(self, future, bytes_transferred: int, **kwargs) -> None:
        if bytes_transferred > 0:  # a retried part reports its bytes again as negative progress first
            self._progress(bytes_transferred)


def _subscribers(progress: Progress | None) -> list:
    return [_ProgressSubscriber(progress)] if progress is not None else []


def _code(exc: bx.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


def _is_precondition(exc: bx.ClientError) -> bool:
    # 409 ConditionalRequestConflict: S3 saw a concurrent conditional write to the same key.
    return _code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict") or \
        exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412


class _Translate:
    """Context manager mapping SDK exceptions to the store's exceptions."""

    def __init__(self, store: S3Store, op: str, key: str) -> None:
        self.store, self.op, self.key = store, op, key

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(
                exc, (ObjectNotFound, StoreConfigError, StoreUnavailable, PreconditionFailed)):
            return False
        mapped = self.store._translate(exc, self.op, self.key)
        if isinstance(mapped, ObjectNotFound) and not self.store._bucket_checked:
            # A HEAD on an object in a missing bucket also answers "404" (no body to say
            # otherwise); look once so a typo in the bucket is not mistaken for an absent object.
            self.store.check()
        if mapped is exc:
            return False
        raise mapped from exc
