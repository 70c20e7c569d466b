"""script_gather.py: a script's health rows gathered across its ranks, and the gather never in the way of the
script's end. Two real ranks on a Gloo process group (a FileStore), as a DDP script sets them up."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.job

# Each round: a process group, a DDP model, three reports' gathers (the last just before the script ends), the
# group destroyed as the script does, then the model freed, as it is when a script's scope closes: its reducer
# destroys the group it holds while keeping the GIL. With the gather on that group, rank 0 or 1 hung in that
# destruction within 2 rounds (3 tries in 3); each round's rows are checked.
RANK = textwrap.dedent("""
    import datetime, sys
    import torch, torch.distributed as dist
    from ringflow.training.rank.script_gather import gatherer

    rank, folder, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for i in range(rounds):
        dist.init_process_group("gloo", store=dist.FileStore(f"{folder}/store-{i}", 2), rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=30))
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        gather = gatherer()
        for step in range(3):
            rows = gather([float(step), float(rank)])
            assert rows == [[float(step), 0.0], [float(step), 1.0]], rows
        dist.destroy_process_group()
        del model
        del gather
    print(f"rank {rank}: {rounds} rounds", flush=True)
""")


def test_a_gather_just_before_the_script_ends_never_holds_up_its_process_group_s_end(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    ranks = [subprocess.Popen([sys.executable, str(script), str(rank), str(tmp_path), "20"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        outputs = [rank.communicate(timeout=180)[0] for rank in ranks]
    except subprocess.TimeoutExpired:
        pytest.fail("a rank hung: the gather's tensors held up the process group's destruction")
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    assert all(f"rank {r}: 20 rounds" in out for r, out in enumerate(outputs)), outputs


def test_no_collective_library_means_no_gather():
    from ringflow.training.rank.script_gather import gatherer

    assert "torch.distributed" not in sys.modules or not __import__("torch.distributed").distributed.is_initialized()
    assert gatherer() is None
