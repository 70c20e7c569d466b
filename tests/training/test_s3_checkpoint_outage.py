"""A checkpoint upload that fails for good, in a real 2-worker job whose run folder is on S3 (moto behind
tests/s3_fault_proxy.py): every attempt to upload ckpt-40 fails while the first try runs, so that try stops with
STORE_UNAVAILABLE (the background writer's failure, not a crash) after the store's retries; the store comes back
and the next try resumes from ckpt-20, the last complete checkpoint, losing only the steps after it.

A job (`ringflow train`), not a DAG run: that a failed train task is retried is the failure policy's table
(tests/training/core/test_failure_policy.py: STORE_UNAVAILABLE is retried) and the remediation runs'
(tests/operators/test_remediation_converges.py); that the connection's retry settings reach a job's environment
is tests/operators/test_connections.py's; a whole S3 DAG run through the proxy, with transient faults, is
tests/dags/test_s3_pipeline.py's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from s3_fault_proxy import FaultProxy

from ringflow.training.formats import exit_codes
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import S3Store
from run_folder_files import read_result

pytestmark = [pytest.mark.job, pytest.mark.timeout(600)]

MAX_ATTEMPTS = 3
# 2 workers x 32 rows x 22 minibatches = one epoch of digits; a checkpoint every 20 steps over 2 epochs gives
# three (20, 40 and the final 44).
CHECKPOINTS = ["ckpt-000000020", "ckpt-000000040", "ckpt-000000044"]


def test_checkpoint_upload_failing_for_good_stops_the_job_and_the_next_try_resumes_from_the_previous_one(
        s3_server, digits_manifest, tmp_path):
    bucket = s3_server.new_bucket("rf-ckpt-lost")
    with FaultProxy(s3_server.endpoint) as proxy:
        settings = s3_server.settings(endpoint=proxy.endpoint, max_attempts=MAX_ATTEMPTS, read_timeout=2)
        run = S3Store.from_settings(bucket, "runs/r1", settings)
        cfg = {"manifest_uri": digits_manifest, "run_uri": run.uri, "epochs": 2, "batch_size": 32,
               "learning_rate": 0.002, "checkpoint": {"every_steps": 20}}
        path = tmp_path / "job.json"
        path.write_text(json.dumps(cfg))
        command = [sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np", "2",
                   "--controller", "gloo"]
        env = os.environ | settings.to_env() | {"PYTHONUNBUFFERED": "1"}

        def train() -> tuple[int, str]:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
            return proc.returncode, proc.stdout + proc.stderr

        proxy.fail("PUT", r"/runs/r1/.*checkpoints/ckpt-000000040/state\.pt$", times=None)
        code, out = train()
        assert code == exit_codes.BY_VERDICT["STORE_UNAVAILABLE"], out[-4000:]
        assert "ckpt-000000040" in out and "STORE_UNAVAILABLE" in out, out[-3000:]
        lost = proxy.requests("PUT", r"/checkpoints/ckpt-000000040/state\.pt$")
        assert [e.fault for e in lost] == ["fail"] * MAX_ATTEMPTS, lost  # retried, then given up
        assert RunFolder(run).checkpoints().names() == CHECKPOINTS[:1]

        proxy.clear()  # the store is back: the next try
        code, out = train()
        assert code == 0, out[-4000:]
        lost = proxy.requests("PUT", r"/checkpoints/ckpt-000000040/state\.pt$")
        assert lost[-1].fault is None and 200 <= (lost[-1].status or 0) < 300  # this try uploaded it
        result = read_result(run)
        assert result.succeeded and result.resumed_from == CHECKPOINTS[0] and result.step == 44
        assert result.checkpoint == CHECKPOINTS[-1]
        assert sorted(RunFolder(run).checkpoints().names()) == CHECKPOINTS
