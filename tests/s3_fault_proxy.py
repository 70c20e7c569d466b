"""A fault-injecting HTTP reverse proxy for S3 tests: put it between a client and moto's server.

    from s3_fault_proxy import FaultProxy        # tests/ is on sys.path (tests/conftest.py lives there)

    with FaultProxy(s3_server.endpoint) as proxy:
        settings = s3_server.settings(endpoint=proxy.endpoint, max_attempts=4, read_timeout=1)
        proxy.fail("PUT", r"/ckpt-000000020/", times=2, status=503)   # next 2 matching PUTs get 503
        proxy.reset("GET", r"/shards/", times=1)                      # next GET is cut mid-response
        proxy.delay("GET", r"\\?list-type=2", seconds=3, times=1)      # next listing answers 3 s late
        ... run the code under test ...
        assert proxy.faults("PUT", r"/ckpt-") == 2                     # the faults really happened
        assert proxy.requests("PUT", r"/ckpt-", status=200)            # ... and a retry went through

A rule matches a request by method (a regex, "*" for any), by a regex searched in the request
target (path and query, e.g. `/bucket/prefix/key?uploadId=...&partNumber=2`) and optionally by a
regex searched case-insensitively in its header lines ("Name: value", one per line), e.g.
`header="^x-amz-copy-source:"` for the server-side copies of a promotion. Rules are checked in
the order they were added; the first that matches and still has `times` left (None: forever)
applies, and each application uses one of its `times`. Actions:

  fail   answer `status` (default 503 SlowDown) with an S3 XML error body; the request never
         reaches the server, so nothing was written.
  reset  forward the request (so a PUT *did* land), then send part of the answer (half the body,
         or half the header bytes when the body is empty) and reset the TCP connection: the
         client sees a broken connection and cannot know whether its write landed.
  drop   reset the connection as soon as the request is read, without forwarding it.
  delay  forward the request, then wait `seconds` before answering: with a client read timeout
         below that, the client gives up (the write landed) and retries.

Every request is logged (`proxy.log`, a list of `Logged(method, target, status, fault)`; status is
None when the answer was cut) so a test can assert that a fault happened and was retried.

Standing conditions, for a slow store rather than a failing one (they apply to every request until
changed, and never fail a request):

  proxy.link(bytes_per_second=2e6, latency=0.05)  # one shared link: bodies both ways share the bandwidth,
                                                 # every request waits `latency` before it is forwarded
  held = proxy.hold("PUT", r"/run/")              # matching requests wait, unanswered, until released:
  ... held.release()                              # a store that stalls writes (clients time out and retry)

Other helpers' tests reuse this module: the `fault_proxy` fixture below (one proxy per test, in front
of the session's `s3_server`) becomes available in a test module or conftest with
`from s3_fault_proxy import fault_proxy  # noqa: F401` (tests/training/store/conftest.py does it).
Point the code under test at `fault_proxy.endpoint` instead of `s3_server.endpoint`, e.g. through
`s3_server.settings(endpoint=fault_proxy.endpoint)` or `s3_server.env() | {"RINGFLOW_S3_ENDPOINT": ...}`;
create buckets through `s3_server` directly, which no rule touches.
"""
from __future__ import annotations

import dataclasses
import http.client
import http.server
import os
import re
import socket
import struct
import threading
import time
import urllib.parse
from typing import Iterator

import pytest

# Hop-by-hop headers (RFC 9110 7.6.1) are for one connection only, and the proxy handles
# `Expect: 100-continue` itself; none of them may be passed on.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "transfer-encoding", "upgrade", "expect", "proxy-connection"}
_ERROR_CODES = {500: "InternalError", 502: "BadGateway", 503: "SlowDown", 504: "GatewayTimeout"}
ACTIONS = ("fail", "reset", "drop", "delay")


@dataclasses.dataclass
class Rule:
    action: str
    method: str = "*"  # regex matched against the whole method, or "*"
    path: str = ""  # regex searched in the request target (path and query)
    times: int | None = 1  # how many matching requests it applies to; None: all of them
    status: int = 503
    seconds: float = 0.0
    header: str = ""  # regex searched in the request's "Name: value" header lines, ignoring case

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {ACTIONS}")
        if self.times is not None and self.times < 1:
            raise ValueError(f"times must be at least 1 (or None for every request), got {self.times}")
        if self.action == "fail" and not 400 <= self.status <= 599:
            raise ValueError(f"a fail rule answers an error status (400-599), got {self.status}")
        re.compile(self.path)
        re.compile(self.header)

    def matches(self, method: str, target: str, headers: str = "") -> bool:
        if self.method != "*" and not re.fullmatch(self.method, method):
            return False
        if self.header and not re.search(self.header, headers, re.IGNORECASE | re.MULTILINE):
            return False
        return re.search(self.path, target) is not None


@dataclasses.dataclass(frozen=True)
class Logged:
    method: str
    target: str
    status: int | None  # what the client got; None when the connection was cut
    fault: str | None  # the action applied, or None when the request passed untouched


class Link:
    """A shared link of `bytes_per_second` (a token bucket both directions draw from) and a latency per
    request. bytes_per_second None: no limit."""

    CHUNK = 64 * 1024

    def __init__(self, bytes_per_second: float | None = None, latency: float = 0.0):
        self.bytes_per_second, self.latency = bytes_per_second, latency
        self._lock = threading.Lock()
        self._free_at = time.monotonic()

    def take(self, nbytes: int) -> None:
        """Wait until `nbytes` may pass."""
        if not self.bytes_per_second:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._free_at)
            self._free_at = start + nbytes / self.bytes_per_second
            wait = self._free_at - now
        if wait > 0:
            time.sleep(wait)


class Hold:
    """Requests matching (method, path) wait until `release()`: a store that takes no writes for a while."""

    def __init__(self, method: str, path: str):
        self.rule = Rule("delay", method, path, None)
        self._released = threading.Event()
        self.held = 0  # requests that waited

    def release(self) -> None:
        self._released.set()

    def wait(self) -> None:
        self.held += 1
        self._released.wait()


class FaultProxy:
    """A threaded reverse proxy on 127.0.0.1 in front of `upstream` (http://host:port)."""

    def __init__(self, upstream: str, *, port: int = 0, upstream_timeout: float = 60.0) -> None:
        parts = urllib.parse.urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream {upstream!r} must be a plain http://host:port URL")
        self.upstream = (parts.hostname, parts.port)
        self.upstream_timeout = upstream_timeout
        self.log: list[Logged] = []
        self._rules: list[Rule] = []
        self._link = Link()
        self._holds: list[Hold] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.proxy = self
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="s3-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- rules ----------------------------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def fail(self, method: str = "*", path: str = "", *, times: int | None = 1, status: int = 503,
             header: str = "") -> Rule:
        return self.add(Rule("fail", method, path, times, status=status, header=header))

    def reset(self, method: str = "*", path: str = "", *, times: int | None = 1, header: str = "") -> Rule:
        return self.add(Rule("reset", method, path, times, header=header))

    def drop(self, method: str = "*", path: str = "", *, times: int | None = 1, header: str = "") -> Rule:
        return self.add(Rule("drop", method, path, times, header=header))

    def delay(self, method: str = "*", path: str = "", *, seconds: float, times: int | None = 1,
              header: str = "") -> Rule:
        return self.add(Rule("delay", method, path, times, seconds=seconds, header=header))

    def link(self, bytes_per_second: float | None = None, latency: float = 0.0) -> Link:
        """From now on every body passes a shared link of this bandwidth, every request after this latency."""
        self._link = Link(bytes_per_second, latency)
        return self._link

    def hold(self, method: str = "*", path: str = "") -> Hold:
        """Matching requests wait, unanswered, until the returned hold is released."""
        held = Hold(method, path)
        with self._lock:
            self._holds.append(held)
        return held

    def clear(self) -> None:
        """Remove every rule and release every hold (the log stays)."""
        with self._lock:
            self._rules.clear()
            holds, self._holds = self._holds, []
        for held in holds:
            held.release()

    def pending(self) -> list[Rule]:
        """Rules that still have uses left: an exhausted one proves its faults were served."""
        with self._lock:
            return [r for r in self._rules if r.times is None or r.times > 0]

    # -- log ------------------------------------------------------------------------------------

    def requests(self, method: str = "*", path: str = "", *, status: int | None | str = "any") -> list[Logged]:
        """Logged requests matching method/path (as rules do) and, if given, the status."""
        probe = Rule("fail", method, path)
        with self._lock:
            return [e for e in self.log if probe.matches(e.method, e.target)
                    and (status == "any" or e.status == status)]

    def faults(self, method: str = "*", path: str = "") -> int:
        return sum(1 for e in self.requests(method, path) if e.fault is not None)

    # -- used by the handler --------------------------------------------------------------------

    def _take(self, method: str, target: str, headers: str) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if (rule.times is None or rule.times > 0) and rule.matches(method, target, headers):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
        return None

    def _record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy


class _Cut(Exception):
    """The handler reset the client connection; nothing more may be written to it."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real S3 endpoint; also answers 100-continue
    server: _Server

    def log_message(self, format: str, *args) -> None:  # the proxy's own log is enough
        pass

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _proxy(self) -> None:
        proxy = self.server.proxy
        method, target = self.command, self.path
        try:
            body = self._read_body()
            header_lines = "\n".join(f"{k}: {v}" for k, v in self.headers.items())
            link = proxy._link
            if link.latency:
                time.sleep(link.latency)
            with proxy._lock:
                holds = [h for h in proxy._holds if h.rule.matches(method, target, header_lines)]
            for held in holds:
                held.wait()
            rule = proxy._take(method, target, header_lines)
            fault = rule.action if rule else None
            if rule is not None and rule.action == "drop":
                proxy._record(Logged(method, target, None, fault))
                self._cut()
            if rule is not None and rule.action == "fail":
                proxy._record(Logged(method, target, rule.status, fault))
                self._answer_error(rule.status, method)
                return
            status, reason, headers, payload = self._forward(method, target, body)
            if rule is not None and rule.action == "reset":
                proxy._record(Logged(method, target, None, fault))
                self._send_partial(status, reason, headers, payload, method)
            # Logged before a delay, so a test that moved on (its client timed out) sees it.
            proxy._record(Logged(method, target, status, fault))
            if rule is not None and rule.action == "delay":
                time.sleep(rule.seconds)
            self._answer(status, reason, headers, payload, method)
        except _Cut:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. its read timeout)
            self.close_connection = True

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(chunks)
                chunks.append(self._read_paced(size))
                self.rfile.readline()
        return self._read_paced(int(self.headers.get("Content-Length") or 0))

    def _read_paced(self, size: int) -> bytes:
        """`size` bytes of the request, at the link's pace (an upload over a slow link)."""
        link, parts = self.server.proxy._link, []
        while size > 0:
            n = min(size, Link.CHUNK)
            link.take(n)
            part = self.rfile.read(n)
            if not part:
                break
            parts.append(part)
            size -= len(part)
        return b"".join(parts)

    def _forward(self, method: str, target: str, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        host, port = self.server.proxy.upstream
        conn = http.client.HTTPConnection(host, port, timeout=self.server.proxy.upstream_timeout)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or method in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            return response.status, response.reason, kept, payload
        finally:
            conn.close()

    def _head(self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes, method: str) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason}"]
        has_length = any(k.lower() == "content-length" for k, _ in headers)
        lines += [f"{k}: {v}" for k, v in headers]
        if not has_length and method != "HEAD":
            lines.append(f"Content-Length: {len(payload)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _answer(self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes, method: str) -> None:
        self.wfile.write(self._head(status, reason, headers, payload, method))
        if method != "HEAD":
            link = self.server.proxy._link
            for start in range(0, len(payload), Link.CHUNK):  # a download over a slow link
                chunk = payload[start:start + Link.CHUNK]
                link.take(len(chunk))
                self.wfile.write(chunk)
        self.wfile.flush()

    def _answer_error(self, status: int, method: str) -> None:
        code = _ERROR_CODES.get(status, "InjectedFault")
        payload = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                   f"<Message>injected by s3_fault_proxy</Message><RequestId>fault-{os.getpid()}</RequestId>"
                   f"</Error>").encode()
        headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(payload)))]
        self._answer(status, http.client.responses.get(status, "Error"), headers, payload, method)

    def _send_partial(self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes,
                      method: str) -> None:
        head = self._head(status, reason, headers, payload, method)
        if payload and method != "HEAD":
            self.wfile.write(head + payload[: len(payload) // 2])
        else:
            self.wfile.write(head[: len(head) // 2])
        self.wfile.flush()
        self._cut()

    def _cut(self) -> None:
        """Reset the connection (RST, not FIN): the client sees 'connection reset by peer'."""
        sock = self.connection
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        os.close(sock.detach())  # the real close, even though rfile still refers to the socket
        raise _Cut()

    def finish(self) -> None:
        try:
            super().finish()
        except (OSError, ValueError):  # the socket was cut or the client went away
            pass


@pytest.fixture
def fault_proxy(s3_server) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the session's moto server, with no rules; stopped after the test."""
    with FaultProxy(s3_server.endpoint) as proxy:
        yield proxy
