"""torchrun with forked ranks (rank/forked_torchrun.py): the ranks forked on a CPU build of torch, spawned as new
interpreters on a CUDA build (a fork after torchrun's CUDA check could not use the GPU)."""
import pytest

from ringflow.training.rank.forked_torchrun import start_method

ARGS = ["forked_torchrun", "--nnodes", "1", "--run-path", "--start-method", "fork", "forked_rank.py", "-m", "ringflow.training",
        "job.json"]


@pytest.mark.parametrize("cuda_build, method", [(False, "fork"), (True, "spawn")])
def test_ranks_are_forked_unless_torch_is_a_cuda_build(cuda_build, method):
    out = start_method(ARGS, cuda_build)
    assert out[out.index("--start-method") + 1] == method
    assert [a for a in out if a not in ("fork", "spawn")] == [a for a in ARGS if a != "fork"]


def test_arguments_without_a_start_method_are_left_as_they_are():
    assert start_method(["forked_torchrun", "--nnodes", "1"], True) == ["forked_torchrun", "--nnodes", "1"]


LOG_A_FAILURE = """
import logging, sys
from ringflow.training.rank import forked_torchrun
if sys.argv[1] == "plain":
    forked_torchrun.plain_tracebacks()
try:
    raise RuntimeError("process 1 terminated with signal SIGKILL")
except RuntimeError:
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").exception("failed (exitcode: -9)")
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""


@pytest.mark.job  # a Python subprocess: torch._dynamo may be imported in the suite's own process already
@pytest.mark.parametrize("how, dynamo", [("plain", False), ("torch's", True)])
def test_torchrun_s_log_of_a_failed_worker_keeps_its_traceback_without_importing_dynamo(how, dynamo):
    """torch's log formatter imports torch._dynamo to format a traceback (0.4-0.9 s of every elastic restart
    here); formatted plainly first, the same traceback is logged without it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LOG_A_FAILURE, how], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"dynamo imported: {dynamo}" in done.stdout, done.stdout + done.stderr
    assert "failed (exitcode: -9)" in done.stderr and "Traceback (most recent call last)" in done.stderr
    assert "RuntimeError: process 1 terminated with signal SIGKILL" in done.stderr, done.stderr
