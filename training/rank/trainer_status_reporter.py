"""Rank 0 of a TrainJob reports its progress into the TrainJob's `status.trainerStatus` (health/trainer_status.py
builds each report) by a merge patch of the status subresource through the Kubernetes API, with the pod's service
account token. A thread of its own sends: training hands it the newest report and goes on, never waiting for the
API server; a report that arrives while one is in flight replaces the one waiting (only the newest matters).

A failed update is logged once (again only after a success) and the next report is the retry: progress is
advisory, so nothing here may fail or slow training. Torch-free and Airflow-free, the standard library only: a
rank's pod has no Kubernetes client.

Where the API is: `$RINGFLOW_KUBERNETES_API` when set (an http(s) URL, e.g. `kubectl proxy`'s, which
authenticates itself), else in-cluster, https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT with the service
account's CA and token (read again for every update: projected tokens rotate).
"""
from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import urllib.parse
import urllib.request
from typing import Mapping

from ..health.trainer_status import TRAINJOB_NAME_ENV, TRAINJOB_NAMESPACE_ENV, TrainerStatus

API_ENV = "RINGFLOW_KUBERNETES_API"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# One update may take this long before it counts as failed; the thread, not training, waits.
REQUEST_TIMEOUT_SECONDS = 3.0
# At the end of training the last report (100%) gets this long to go out before the rank moves on.
FINAL_WAIT_SECONDS = 2.0
TRAINJOBS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"

log = logging.getLogger(__name__)


class TrainerStatusReporter:
    """Sends TrainerStatus reports for one TrainJob from a daemon thread; `submit` never blocks."""

    def __init__(self, api_url: str, namespace: str, name: str, token_file: str | None = None,
                 ca_file: str | None = None):
        parts = urllib.parse.urlsplit(api_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"Kubernetes API URL {api_url!r} is not http(s)://host[:port]; set ${API_ENV} to one, "
                             f"or unset it to use the in-cluster service")
        self.url = api_url.rstrip("/") + TRAINJOBS_PATH.format(namespace=urllib.parse.quote(namespace, safe=""),
                                                                name=urllib.parse.quote(name, safe=""))
        self._token_file, self._context = token_file, None
        if parts.scheme == "https":
            self._context = ssl.create_default_context(cafile=ca_file if ca_file and os.path.exists(ca_file) else None)
        self._pending: TrainerStatus | None = None
        self._wake = threading.Condition()
        self._closed = False
        self._failing = False
        self.sent = 0  # updates the API server accepted
        self._thread = threading.Thread(target=self._run, name="ringflow-trainer-status", daemon=True)
        self._thread.start()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "TrainerStatusReporter | None":
        """The reporter of the TrainJob this pod belongs to; None outside a TrainJob (no name in the environment,
        as on the local backend or an MPIJob) or where no API can be found."""
        name, namespace = environ.get(TRAINJOB_NAME_ENV, ""), environ.get(TRAINJOB_NAMESPACE_ENV, "")
        if not name or not namespace:
            return None
        api = environ.get(API_ENV, "")
        token = ca = None
        if not api:
            host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                log.warning("trainerStatus: $%s is set but no Kubernetes API is known ($KUBERNETES_SERVICE_HOST "
                            "unset, $%s unset): progress is not reported", TRAINJOB_NAME_ENV, API_ENV)
                return None
            api = f"https://{'[' + host + ']' if ':' in host else host}:{port}"
            token, ca = f"{SERVICE_ACCOUNT_DIR}/token", f"{SERVICE_ACCOUNT_DIR}/ca.crt"
        return cls(api, namespace, name, token, ca)

    def submit(self, status: TrainerStatus) -> None:
        """Hand over the newest report; it replaces one not sent yet."""
        with self._wake:
            self._pending = status
            self._wake.notify()

    def close(self, wait: float = FINAL_WAIT_SECONDS) -> None:
        """Send what is pending (waiting at most `wait` seconds), then stop the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(wait)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                status, self._pending = self._pending, None
                closed = self._closed
            if status is not None:
                self._send(status)
            if closed and self._pending is None:
                return

    def _send(self, status: TrainerStatus) -> None:
        request = urllib.request.Request(self.url, data=json.dumps(status.patch_body()).encode(), method="PATCH",
                                         headers={"Content-Type": "application/merge-patch+json",
                                                  "Accept": "application/json"})
        try:
            if self._token_file:
                with open(self._token_file) as f:
                    request.add_header("Authorization", f"Bearer {f.read().strip()}")
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS, context=self._context) as answer:
                answer.read()
        except Exception as exc:  # noqa: BLE001 - progress is advisory: no failure of it reaches training
            if not self._failing:
                detail = exc.read().decode(errors="replace")[:300] if hasattr(exc, "read") else ""
                log.warning("trainerStatus: could not update %s (%s%s); retrying with the next report (every few "
                            "seconds), logged once until one succeeds. Check the pod's service account may patch "
                            "trainjobs/status (deploy/rbac.yaml)", self.url, exc, f": {detail}" if detail else "")
                self._failing = True
            return
        self._failing = False
        self.sent += 1
