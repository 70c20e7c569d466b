"""The deferrable Horovod training operator: build the job spec, launch it through a Backend, defer to the
trigger, and turn the trigger's one event into success or a failure a person can act on."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import time
from typing import Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ringflow.operators.backends.base import Backend
from ringflow.operators.job_spec import JobSpec
from ringflow.training.launcher import DEFAULT_CONTROLLER


NOT_RETRYABLE = ("NONFINITE", "DIVERGED")


def job_name(dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
    """A DNS-1123 name, readable and unique per task try (an MPIJob name and a local job folder alike)."""
    digest = hashlib.sha256(f"{dag_id}\0{run_id}\0{task_id}".encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", f"{dag_id}-{task_id}".lower()).strip("-")[:36].strip("-")
    return f"rf-{slug}-{digest}-t{try_number}"


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in (overrides or {}).items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class HorovodTrainOperator(BaseOperator):
    """Train with Horovod (synchronous ring all-reduce) on `num_workers` workers, without holding a worker slot.

    :param manifest_uri: the shard step's manifest.json (templated).
    :param run_uri: the run folder: checkpoints, health.jsonl, result.json (templated). The same folder for
        every try of the task, so a retry resumes from the last checkpoint.
    :param job_config: overrides of the training config (epochs, batch_size, learning_rate, model, health,
        horovod, ...; see ringflow.training.config.JobConfig) (templated).
    :param backend: where the job runs; local `horovodrun` processes by default, or
        ringflow.operators.kubernetes.backend.MPIJobBackend for Kubeflow MPIJobs.
    :param conn_id: Airflow connection (type aws) for s3:// URIs.
    :param job_timeout: stop the job and fail the task when it runs longer.
    """

    template_fields: Sequence[str] = ("manifest_uri", "run_uri", "job_config", "num_workers")
    template_fields_renderers = {"job_config": "json"}
    ui_color = "#f4a261"

    def __init__(self, *, manifest_uri: str, run_uri: str, num_workers: int | str = 2,
                 job_config: dict[str, Any] | None = None, backend: Backend | None = None, controller: str = DEFAULT_CONTROLLER,
                 conn_id: str | None = None, poll_interval: float = 2.0, job_timeout: dt.timedelta | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.manifest_uri, self.run_uri, self.num_workers = manifest_uri, run_uri, num_workers
        self.job_config = job_config or {}
        self.backend = backend
        self.controller, self.conn_id, self.poll_interval = controller, conn_id, poll_interval
        self.job_timeout = job_timeout
        self._job_id: str | None = None

    def _get_backend(self) -> Backend:
        if self.backend is None:
            from ringflow.operators.backends.local import LocalProcessBackend

            self.backend = LocalProcessBackend(conn_id=self.conn_id)
        return self.backend

    def build_config(self) -> dict[str, Any]:
        from ringflow.training.config import JobConfig

        base = {"manifest_uri": self.manifest_uri, "checkpoint": {"uri": self.run_uri}}
        config = merge(base, self.job_config if isinstance(self.job_config, dict) else json.loads(self.job_config))
        return JobConfig.from_dict(config).to_dict()  # checked here: a bad value fails before any launch

    def execute(self, context) -> None:
        ti = context["ti"]
        config = self.build_config()
        num_workers = int(self.num_workers)
        self._check_shards(config, num_workers)
        labels = {"dag": ti.dag_id, "run": ti.run_id, "task": ti.task_id}
        backend = self._get_backend()
        job_id = backend.find(labels)
        if job_id:
            self.log.info("reattaching to live job %s from an earlier try (labels %s)", job_id, labels)
        else:
            spec = JobSpec(name=job_name(ti.dag_id, ti.run_id, ti.task_id, ti.try_number), config=config,
                           num_workers=num_workers, controller=self.controller,
                           labels=labels | {"try": str(ti.try_number)})
            job_id = backend.launch(spec)
            self.log.info("launched %s job %s: %d workers, run folder %s", backend.kind, job_id, num_workers,
                          self.run_uri)
        self._job_id = job_id
        from ringflow.operators.trigger import HorovodJobTrigger

        timeout_at = time.time() + self.job_timeout.total_seconds() if self.job_timeout else None
        self.defer(
            trigger=HorovodJobTrigger(backend_kind=backend.kind, backend_kwargs=backend.to_dict(), job_id=job_id,
                                      run_uri=self.run_uri, health=config["health"], conn_id=self.conn_id,
                                      poll_interval=self.poll_interval, timeout_at=timeout_at),
            method_name="execute_complete",
        )

    def _check_shards(self, config: dict[str, Any], num_workers: int) -> None:
        from ringflow.operators.connections import open_store_for
        from ringflow.training.manifest import ShardManifest
        from ringflow.training.store import split_uri

        parent, name = split_uri(config["manifest_uri"])
        manifest = ShardManifest.from_json(open_store_for(parent, self.conn_id).get_bytes(name))
        if manifest.num_partitions != num_workers:
            raise AirflowException(
                f"the shards at {config['manifest_uri']} have {manifest.num_partitions} partitions but the job "
                f"asks for {num_workers} workers: shard for {num_workers} workers or set num_workers to "
                f"{manifest.num_partitions}")

    def execute_complete(self, context, event: dict[str, Any]) -> dict[str, Any]:
        plot = self._save_health_plot()
        if event.get("status") != "success":
            verdict = event.get("verdict") or {}
            evidence = f"; evidence: {json.dumps(verdict.get('evidence'), default=str)}" if verdict.get("evidence") else ""
            message = f"{event.get('message')}{evidence}"
            if verdict.get("status") in NOT_RETRYABLE:
                # A retry resumes from a checkpoint of the same run and meets the same NaN or divergence:
                # fail for good and let a person change the config.
                raise AirflowFailException(message)
            raise AirflowException(message)
        result = self._read_result()
        self.log.info("training succeeded: checkpoint %s, step %s, health %s", result.get("checkpoint"),
                      result.get("step"), (result.get("verdict") or {}).get("status"))
        return {"run_uri": self.run_uri, "job_id": event.get("job_id"), "status": result.get("status"),
                "checkpoint": result.get("checkpoint"), "step": result.get("step"), "loss": result.get("loss"),
                "verdict": result.get("verdict"), "resumed_from": result.get("resumed_from"), "health_plot": plot}

    def _read_result(self) -> dict[str, Any]:
        from ringflow.operators.connections import open_store_for
        from ringflow.training import run_layout

        return json.loads(open_store_for(self.run_uri, self.conn_id).get_bytes(run_layout.RESULT))

    def _save_health_plot(self) -> str | None:
        import tempfile

        from ringflow.operators.connections import open_store_for
        from ringflow.operators.health_plot import save_health_plot
        from ringflow.operators.run_health import read_records
        from ringflow.training import run_layout

        try:
            records = read_records(self.run_uri, self.conn_id)
            if not records:
                return None
            with tempfile.TemporaryDirectory() as tmp:
                path = save_health_plot(records, f"{tmp}/{run_layout.HEALTH_PLOT}")
                open_store_for(self.run_uri, self.conn_id).put_file(run_layout.HEALTH_PLOT, path)
        except Exception as exc:  # noqa: BLE001 - a missing plot must not hide the job's own outcome
            self.log.warning("could not save the health plot: %s", exc)
            return None
        location = f"{self.run_uri.rstrip('/')}/{run_layout.HEALTH_PLOT}"
        self.log.info("health plot saved: %s", location)
        return location

    def on_kill(self) -> None:
        # Before deferral the job is ours to stop; once deferred, the trigger's on_kill stops it.
        if self._job_id:
            self._get_backend().delete(self._job_id)
