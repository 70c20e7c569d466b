"""`ringflow train --retries N [--remediation auto]` (training/core/local_retries.py): the train task's tries from
a shell. What comes after each try is core/attempts.py's (its table: test_attempts.py); here one real run
shows the loop end to end (a bad count is refused in one line: test_shell_commands.py's table)."""
import json
import os
import subprocess
import sys

import pytest

from ringflow.training.formats.run_folder import RunFolder


@pytest.mark.job
def test_an_oom_is_retried_with_a_smaller_batch_and_succeeds(jobs, janitor):
    """Try 1 runs out of memory at step 12 above a per-worker batch of 16 (an injected `oom`, try 1's only);
    `--remediation auto` overrides the config's "off": try 2 runs with batch 16 and two backward passes, resumes
    from step 10's checkpoint, succeeds, and its result names the remedy; remedies.jsonl in the run folder has
    it for try 2."""
    cfg = jobs.config("run", epochs=1, remediation="off", faults=[{"kind": "oom", "step": 12, "above_batch": 16}])
    path = jobs.root / "job.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np", "2",
                             "--controller", "gloo", "--retries", "1", "--remediation", "auto"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    janitor.launcher(proc.pid)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    lines = [line for line in out.splitlines() if line.startswith("[ringflow] ")]
    assert "[ringflow] try 1 of 2: as given" in lines, lines
    assert "[ringflow] job exited with 9 (health verdict OOM)" in lines, lines
    (changed,) = [line for line in lines if line.startswith("[ringflow] try 2 of 2: ")]
    assert "changed after OOM: out of memory" in changed, changed
    assert lines[-1] == "[ringflow] job exited with 0 (succeeded)", lines
    result = jobs.result(cfg)
    assert result.succeeded and result.resumed_from == "ckpt-000000010", result
    assert [(r["try"], r["remedy"], r["verdict"]) for r in result.remedies] == [(2, "smaller_batch", "OOM")]
    (line,) = RunFolder.open(cfg["run_uri"]).read_remedies()
    assert (line["try"], line["remedy"], line["settings"]["batch_size"]) == (2, "smaller_batch", 16)


@pytest.mark.parametrize("retries, fired", [(0, [1, 2]), (1, [1])])
def test_one_try_runs_every_fault_given_and_tries_of_its_own_only_theirs(tmp_path, monkeypatch, retries, fired):
    """Without --retries the config runs as given (the train operator's job: its config already holds only
    that task try's faults); with them, each try runs the faults of its own number (`on_try`)."""
    from ringflow.training.core import launcher, local_retries
    from ringflow.training.core.backends.base import JobState
    from ringflow.training.core.failure_policy import Observation

    cfg = {"manifest_uri": str(tmp_path / "manifest.json"), "run_uri": str(tmp_path / "run"),
           "faults": [{"kind": "crash", "step": 3, "on_try": 1}, {"kind": "crash", "step": 5, "on_try": 2}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(cfg))
    ran = []

    def run_attempt(config_path, *args, **kwargs):
        ran.append(json.loads(open(config_path).read()))
        return Observation(JobState.SUCCEEDED, 0)

    monkeypatch.setattr(launcher, "run_attempt", run_attempt)
    assert local_retries.train_with_retries(str(path), 2, retries=retries) == 0
    assert [f["on_try"] for f in ran[0]["faults"]] == fired
