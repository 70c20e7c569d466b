"""The launcher's OomWatch: a rank gone while its memory cgroup's OOM-kill count rose is one the kernel's OOM
killer ended (an OOM a rank caught and printed: health/verdict_line.py). The cgroups here are folders laid out
as the kernel's; the ranks are this process (alive) or it with another start time (gone)."""
from ringflow.training.core.backends.processes.oom_watch import OomWatch
from ringflow.training.health.memory_limits import MemoryLimits
from ringflow.training.health.oom import KERNEL_OOM_KILLER
from ringflow.training.health.oom_advice import JobShape
from ringflow.training.health.verdict import OOM

MiB = 2**20
SHAPE = JobShape(32, 1, 2)


def cgroup(tmp_path, name, kills=0, limit=256 * MiB):
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "memory.limit_in_bytes").write_text(str(limit))
    (folder / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
    return folder


def rank(rank, folder, alive):
    me = MemoryLimits.read(rank)
    return MemoryLimits(pid=me.pid, start=me.start if alive else me.start - 1, rank=rank, cgroup=str(folder),
                        cgroup_limit_bytes=256 * MiB, oom_kills=0)


def test_a_rank_gone_with_its_cgroup_oom_kill_count_up_is_named(tmp_path):
    watch = OomWatch(SHAPE, heartbeat_step=lambda: 6)
    watch.feed("[1,0]<stderr>:" + rank(0, cgroup(tmp_path, "r0"), alive=True).line())
    watch.feed("[1,1]<stderr>:" + rank(1, cgroup(tmp_path, "r1"), alive=False).line())
    assert watch.look() is None  # gone, but not by the OOM killer (yet): a crash is not an OOM
    cgroup(tmp_path, "r1", kills=1)
    verdict = watch.look()
    assert verdict.status == OOM and verdict.evidence["kind"] == KERNEL_OOM_KILLER
    assert (verdict.evidence["rank"], verdict.evidence["step"], verdict.evidence["limit_bytes"]) == (1, 7, 256 * MiB)
    assert "rank 1 ran out of memory at step 7" in verdict.reason and "batch_size 32 -> 16" in verdict.reason


def test_ranks_sharing_a_cgroup_all_gone_are_not_told_apart(tmp_path):
    shared = cgroup(tmp_path, "job")
    watch = OomWatch(SHAPE)
    for r in (0, 1):
        watch.feed(rank(r, shared, alive=False).line())
    cgroup(tmp_path, "job", kills=1)
    verdict = watch.look()
    assert verdict.evidence["rank"] is None and "ranks [0, 1] share it" in verdict.evidence["message"]


def test_one_gone_of_a_shared_cgroup_while_the_other_lives_is_the_one(tmp_path):
    shared = cgroup(tmp_path, "job")
    watch = OomWatch(SHAPE)
    watch.feed(rank(0, shared, alive=True).line())
    watch.feed(rank(1, shared, alive=False).line())
    cgroup(tmp_path, "job", kills=1)
    assert watch.look().evidence["rank"] == 1


def test_running_looks_until_it_finds_one(tmp_path):
    watch = OomWatch(SHAPE)
    watch.feed(rank(1, cgroup(tmp_path, "r1", kills=0), alive=False).line())
    with watch.running():
        cgroup(tmp_path, "r1", kills=1)
    assert watch.verdict is not None and watch.verdict.evidence["rank"] == 1
