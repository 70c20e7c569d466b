"""tf_pod: the TF_CONFIG a TensorFlow TrainJob pod derives from its index, the JobSet's name and the node
count, over a table of pods; the variable it names when one is missing; and that it becomes the rank with
TF_CONFIG set, on its own interpreter, having imported neither torch nor the Kubernetes client (the TF venv
has neither). The same derivation from what kmock and the JobSet give a pod: test_trainjob_backend.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ringflow.training.core.backends.kubernetes import tf_pod
from ringflow.training.formats import exit_codes


def pod_env(index="0", jobset="retrain-1", workers="2"):
    return {"JOB_COMPLETION_INDEX": index, "RINGFLOW_JOBSET_NAME": jobset, "RINGFLOW_NUM_WORKERS": workers}


@pytest.mark.parametrize("env, workers, index", [
    (pod_env("0", "j", "1"), ["j-node-0-0.j:29500"], 0),
    (pod_env("0"), ["retrain-1-node-0-0.retrain-1:29500", "retrain-1-node-0-1.retrain-1:29500"], 0),
    (pod_env("1"), ["retrain-1-node-0-0.retrain-1:29500", "retrain-1-node-0-1.retrain-1:29500"], 1),
    (pod_env("3", "rf-a", "4"), [f"rf-a-node-0-{i}.rf-a:29500" for i in range(4)], 3),
])
def test_pod_tf_config(env, workers, index):
    assert tf_pod.pod_tf_config(env) == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


@pytest.mark.parametrize("change, message", [
    ({"RINGFLOW_NUM_WORKERS": None}, r"\$RINGFLOW_NUM_WORKERS is '', not a whole number >= 1; the TrainJob's env"),
    ({"RINGFLOW_NUM_WORKERS": "0"}, r"\$RINGFLOW_NUM_WORKERS is '0'"),
    ({"JOB_COMPLETION_INDEX": None}, r"\$JOB_COMPLETION_INDEX is ''.*Indexed Jobs.*kubectl apply -k deploy/trainer"),
    ({"JOB_COMPLETION_INDEX": "-1"}, r"\$JOB_COMPLETION_INDEX is '-1'"),
    ({"RINGFLOW_JOBSET_NAME": ""}, r"\$RINGFLOW_JOBSET_NAME is empty.*re-apply deploy/trainer"),
    ({"JOB_COMPLETION_INDEX": "2"}, r"\$JOB_COMPLETION_INDEX is 2 but \$RINGFLOW_NUM_WORKERS is 2.*numNodes"),
])
def test_a_pod_without_what_tf_config_comes_from_says_which_variable(change, message):
    env = {k: v for k, v in (pod_env() | change).items() if v is not None}
    with pytest.raises(tf_pod.PodEnvError, match=message):
        tf_pod.pod_tf_config(env)


def test_main_becomes_the_rank_with_tf_config_set(monkeypatch):
    execs = []
    monkeypatch.setattr(tf_pod.os, "execve", lambda path, argv, env: execs.append((path, argv, env)))
    env = pod_env("1") | {"RINGFLOW_ENGINE": "tensorflow", "PATH": "/opt/tensorflow/bin:/usr/bin"}
    tf_pod.main(["/etc/ringflow/job.json"], env)
    ((path, argv, child_env),) = execs
    assert path == sys.executable and argv == [sys.executable, "-m", "ringflow.training", "/etc/ringflow/job.json"]
    assert json.loads(child_env.pop("TF_CONFIG")) == tf_pod.pod_tf_config(env)
    # The rank variables torchrun would give: its rank and the job's size, the only worker on its host.
    assert {k: child_env.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")} == {
        "RANK": "1", "WORLD_SIZE": str(len(tf_pod.pod_tf_config(env)["cluster"]["worker"])), "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1"}
    assert child_env == env  # everything else passes through unchanged


def test_main_refuses_a_bad_pod_without_starting_the_rank(monkeypatch, capsys):
    monkeypatch.setattr(tf_pod.os, "execve", lambda *a: pytest.fail("the rank must not start"))
    assert tf_pod.main(["/etc/ringflow/job.json"], pod_env(jobset="")) == exit_codes.CONFIG
    assert capsys.readouterr().err.strip() == (
        "[ringflow] cannot derive TF_CONFIG: $RINGFLOW_JOBSET_NAME is empty; the ringflow-tensorflow runtime sets "
        "it from the pod's jobset-name label: re-apply deploy/trainer")
    assert tf_pod.main([], pod_env()) == exit_codes.CONFIG and "usage:" in capsys.readouterr().err


@pytest.mark.job
def test_the_pod_entry_runs_as_a_module_without_torch_or_the_kubernetes_client():
    code = ("import sys, runpy\n"
            "sys.argv = ['tf_pod']\n"  # no config: the usage line, exit 2, before anything is started
            "try:\n"
            f"    runpy.run_module({tf_pod.__name__!r}, run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    print(e.code, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'kubernetes', 'horovod', "
            "'airflow', 'numpy', 'pyarrow'}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "2 []", out.stderr
    assert "usage: python -m ringflow.training.core.backends.kubernetes.tf_pod" in out.stderr
