"""Each rank's share of the CPUs (training/rank/cores.py): the decision as a table, the launchers' local ranks, and
the binding itself on this process's threads (restored after). Real 2-rank jobs: test_bind_cores_jobs.py."""
import os
import re
import threading

import pytest

from ringflow.training.rank import cores
from ringflow.training.rank.cores import CpuShare, claim_cpu_share, cpu_list, decide_cpu_share, local_rank_from_env

EIGHT = tuple(range(8))
# A 4-core host with 2 hardware threads a core, as cpu_limits.by_core orders it: a core's threads side by side.
SMT = (0, 4, 1, 5, 2, 6, 3, 7)
HOST = 64  # CPUs online on a node whose pods see some of them


@pytest.mark.parametrize("usable, quota, host, local_rank, local_size, option, cpus, threads, bound, says", [
    # A CPU set of the job's own (a pod's cpuset, taskset): two ranks get half each, one keeps all.
    ((0, 1), None, HOST, 0, 2, "auto", (0,), 1, True, "1 of 2 usable CPUs for each of 2 ranks on this host"),
    ((0, 1), None, HOST, 1, 2, "auto", (1,), 1, True, "1 of 2 usable CPUs"),
    ((0, 1), None, HOST, 0, 1, "auto", (0, 1), 2, True, "2 of 2 usable CPUs for each of 1 rank on"),
    ((0, 1), None, HOST, 1, 2, False, (0, 1), 1, False, "bind_cores is false"),
    # Equal shares, consecutive CPUs; a CPU left over stays unused (the job goes at its slowest rank's pace).
    (EIGHT, None, HOST, 1, 2, "auto", (4, 5, 6, 7), 4, True, "4 of 8 usable CPUs"),
    (EIGHT, None, HOST, 2, 3, "auto", (4, 5), 2, True, "2 of 8 usable CPUs for each of 3 ranks"),
    ((0, 1, 2), None, HOST, 1, 2, "auto", (1,), 1, True, "1 of 3"),
    # Hardware threads of one core stay with one rank.
    (SMT, None, HOST, 1, 2, "auto", (2, 6, 3, 7), 4, True, ""),
    # Every CPU of the host (this machine, a bare host): shared with other work, so auto floats; true binds.
    ((0, 1), None, 2, 0, 2, "auto", (0, 1), 1, False, "all 2 CPUs of the host, which other work shares"),
    ((0, 1), None, 2, 0, 1, "auto", (0, 1), 2, False, "bind_cores: true binds on a host the job has to itself"),
    ((0, 1), None, 2, 1, 2, True, (1,), 1, True, "1 of 2 usable CPUs"),
    (EIGHT, None, 8, 0, 2, True, (0, 1, 2, 3), 4, True, ""),
    # More ranks than CPUs: never bound, one thread each.
    ((0, 1), None, HOST, 2, 3, "auto", (0, 1), 1, False, "3 ranks on this host outnumber its 2 usable CPUs"),
    ((0,), None, HOST, 0, 2, True, (0,), 1, False, "outnumber its 1 usable CPU"),
    # A pod with CPUs of its own (Kubernetes' static CPU manager: cpuset and quota the same size).
    ((4, 5, 6, 7), 4.0, HOST, 1, 2, "auto", (6, 7), 2, True, "within a CPU quota of 4 cores"),
    ((4, 5, 6, 7), 6.0, HOST, 0, 2, "auto", (4, 5), 2, True, ""),
    # A quota smaller than the CPU set: a shared pool, where auto does not bind; threads sized to the quota.
    (EIGHT, 4.0, HOST, 1, 2, "auto", EIGHT, 2, False, "smaller than the 8 CPUs this process may run on"),
    (EIGHT, 4.0, HOST, 1, 2, True, (2, 3), 2, True, "2 of 8 usable CPUs for each of 2 ranks on this host, within"),
    (EIGHT, 2.5, HOST, 0, 1, True, (0, 1), 2, True, ""),
    (EIGHT, 2.5, 8, 0, 1, "auto", EIGHT, 2, False, "bind_cores: true binds anyway"),
    # Below one core per rank: never bound, one thread.
    (EIGHT, 1.5, HOST, 1, 2, True, EIGHT, 1, False, "the CPU quota of 1.5 cores is below one core for each of 2"),
    (EIGHT, 0.5, HOST, 0, 1, True, EIGHT, 1, False, "below one core"),
    (EIGHT, 3.0, HOST, 1, 2, False, EIGHT, 1, False, "bind_cores is false"),
])
def test_the_share(usable, quota, host, local_rank, local_size, option, cpus, threads, bound, says):
    share = decide_cpu_share(usable, quota, host, local_rank, local_size, option)
    assert (share.cpus, share.threads, share.bound) == (cpus, threads, bound)
    assert says in share.reason


def test_bound_shares_are_disjoint_and_equal():
    for usable, quota, size in [(EIGHT, None, 2), (EIGHT, None, 3), (SMT, 4.0, 2), (tuple(range(64)), 12.0, 4)]:
        shares = [decide_cpu_share(usable, quota, HOST, r, size, True) for r in range(size)]
        assert all(s.bound and len(s.cpus) == s.threads == shares[0].threads for s in shares)
        taken = [cpu for s in shares for cpu in s.cpus]
        assert len(taken) == len(set(taken)) and set(taken) <= set(usable)


@pytest.mark.parametrize("usable, quota, local_rank, local_size, threads", [
    ((1,), None, 1, 2, 1),             # mpirun's default binding: one core a rank
    ((0, 1, 2, 3), None, 0, 2, 4),     # mpirun -bind-to socket: the rank's own socket
    ((0, 1, 2, 3), 2.0, 0, 2, 1),      # and the pod's quota, shared by its 2 ranks
])
def test_a_launchers_binding_is_kept(usable, quota, local_rank, local_size, threads):
    share = decide_cpu_share(usable, quota, HOST, local_rank, local_size, True, launcher_bound=True)
    assert share == CpuShare(usable, threads, False, share.reason) and "launcher bound this rank" in share.reason


@pytest.mark.parametrize("usable, quota, local_rank, local_size, option, says", [
    ((), None, 0, 1, "auto", "no usable CPUs"),
    ((0, 1), None, 2, 2, "auto", "local rank 2 of 2"),
    ((0, 1), None, -1, 2, "auto", "local rank -1"),
    ((0, 1), 0.0, 0, 1, "auto", "CPU quota 0.0"),
    ((0, 1), None, 0, 1, "yes", "bind_cores 'yes'"),
    ((0, 1), None, 0, 1, 1, "use one of ('auto', True, False)"),
])
def test_impossible_inputs_say_what_is_wrong(usable, quota, local_rank, local_size, option, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        decide_cpu_share(usable, quota, HOST, local_rank, local_size, option)


HOROVOD = (("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"), ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"))


@pytest.mark.parametrize("environ, found", [
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, (1, 2)),
    ({"HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "4"}, (0, 4)),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "HOROVOD_LOCAL_RANK": "3", "HOROVOD_LOCAL_SIZE": "4"}, (3, 4)),  # a pair
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, None),  # torchrun's: not Horovod's launchers
    ({}, None),
])
def test_the_launchers_local_rank(environ, found):
    assert local_rank_from_env(environ, HOROVOD) == found


def test_a_garbled_local_rank_names_the_variables():
    with pytest.raises(ValueError, match=r"\$HOROVOD_LOCAL_RANK='x', \$HOROVOD_LOCAL_SIZE='2'"):
        local_rank_from_env({"HOROVOD_LOCAL_RANK": "x", "HOROVOD_LOCAL_SIZE": "2"}, HOROVOD)


@pytest.mark.parametrize("cpus, text", [((0,), "0"), ((0, 1, 2, 3, 8), "0-3,8"), ((5, 1, 2, 7), "1-2,5,7"),
                                        ((2, 6, 3, 7), "2-3,6-7")])
def test_cpu_lists_read_as_linux_writes_them(cpus, text):
    assert cpu_list(cpus) == text


def thread_masks() -> dict[int, set[int]]:
    return {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}


@pytest.fixture
def restored_affinity():
    before = os.sched_getaffinity(0)
    yield before
    cores.bind_process(before)


def test_claiming_binds_every_thread_and_says_so(restored_affinity, monkeypatch, capsys):
    """Threads already running (pyarrow's and jemalloc's start at import) are bound as well as the ones
    started after; the share's thread count is what the engine gives torch."""
    first = min(restored_affinity)
    release = threading.Event()
    early = threading.Thread(target=release.wait)
    early.start()
    # As if this process's CPU set were its first CPU, alone: binding to it is visible on any host.
    monkeypatch.setattr(cores, "usable_cpus", lambda: (first,))
    monkeypatch.setattr(cores, "cpu_quota_cores", lambda: None)
    try:
        share = claim_cpu_share(True, 0, 1, environ={})
        late = threading.Thread(target=release.wait)
        late.start()
        masks = thread_masks()
    finally:
        release.set()
        early.join()
    late.join()
    assert share == CpuShare((first,), 1, True, share.reason)
    assert early.native_id in masks and late.native_id in masks
    assert all(mask == {first} for mask in masks.values()), masks
    assert f"[ringflow] local rank 0 of 1: bound to CPUs {first}, 1 torch thread (" in capsys.readouterr().out


def test_a_share_not_bound_leaves_the_mask(restored_affinity, monkeypatch, capsys):
    monkeypatch.setattr(cores, "cpu_quota_cores", lambda: None)
    share = claim_cpu_share(False, 0, 1, environ={})
    assert not share.bound and set(share.cpus) == restored_affinity
    assert all(mask == restored_affinity for mask in thread_masks().values())
    assert "not bound, runs on CPUs" in capsys.readouterr().out


def test_mpiruns_own_binding_is_kept(restored_affinity, monkeypatch):
    monkeypatch.setattr(cores, "usable_cpus", lambda: (min(restored_affinity),))
    monkeypatch.setattr(cores, "cpu_quota_cores", lambda: None)
    share = claim_cpu_share(True, 1, 2, environ={cores.OMPI_BOUND_ENV: "1"})
    assert not share.bound and share.threads == 1 and "launcher bound" in share.reason


def test_the_thread_override_is_the_shares_thread_count(restored_affinity, monkeypatch, capsys):
    monkeypatch.setattr(cores, "cpu_quota_cores", lambda: None)
    share = claim_cpu_share(False, 0, 1, environ={cores.TORCH_THREADS_ENV: "3"})
    assert share.threads == 3 and "threads from $RINGFLOW_TORCH_THREADS" in share.reason
    assert "3 torch threads" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"\$RINGFLOW_TORCH_THREADS='two': give a whole number"):
        claim_cpu_share(False, 0, 1, environ={cores.TORCH_THREADS_ENV: "two"})


def test_the_cpu_line_names_the_ranks_own_threads(restored_affinity, monkeypatch, capsys):
    """A TensorFlow rank sizes TensorFlow's intra-op pool, not torch's: its line says so."""
    from ringflow.training.rank.engines.tensorflow import TF_THREAD

    monkeypatch.setattr(cores, "cpu_quota_cores", lambda: None)
    claim_cpu_share(False, 0, 1, environ={cores.TORCH_THREADS_ENV: "2"}, thread=TF_THREAD)
    out = capsys.readouterr().out
    assert "2 TensorFlow intra-op threads" in out and "torch" not in out.replace("RINGFLOW_TORCH_THREADS", "")


def test_a_sandbox_that_forbids_binding_trains_unbound(restored_affinity, monkeypatch, capsys):
    def forbidden(pid, cpus):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(cores, "cpu_quota_cores", lambda: None)
    monkeypatch.setattr(os, "sched_setaffinity", forbidden)
    share = claim_cpu_share(True, 0, 1, environ={})
    assert not share.bound and set(share.cpus) == restored_affinity and share.threads == len(restored_affinity)
    assert "binding failed (Operation not permitted); set bind_cores false" in capsys.readouterr().out
