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



@pytest.mark.job  # a Python subprocess: the suite's own process may have imported torch._dynamo already
def test_the_ranks_inherit_torch_dynamo_from_torchrun_s_process():
    """torch.optim imports torch._dynamo at a rank's first optimizer (0.9 s here), and torch's log formatter at
    torchrun's log of a failed worker: forked_torchrun imports it once, before it forks any rank."""
    import subprocess
    import sys

    check = "import sys; import ringflow.training.rank.forked_torchrun; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stdout + done.stderr
