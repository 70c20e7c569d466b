"""docker/build-horovod.sh's Gloo patches, on the Horovod this machine built with them.

gloo-op-timeout: once connected, Gloo's collectives give up on a dead peer after HOROVOD_GLOO_OP_TIMEOUT_SECONDS,
while the rendezvous keeps HOROVOD_GLOO_TIMEOUT_SECONDS (ElasticConfig.environment sets both). Three Horovod
ranks (Gloo controller, started here as horovodrun's gloo_run starts them: a rendezvous server and the slot
variables) all-reduce in a loop; rank 1 SIGSTOPs itself, a peer that answers nothing and whose sockets stay
open, so the others find it only by the collectives' timeout: with the patch 1 s, not the rendezvous's 60 (a
stock Horovod waits those 60).

gloo-finalize-process-sets: a rank that has shut Horovod down (hvd.shutdown(), as an elastic survivor does
before the next round) closes its process sets' Gloo connections, so a peer still waiting on it is told at
once. The same three ranks; rank 0 cuts its own connections to rank 1 (shutdown(2)), so ranks 0 and 1 fail
their collective and shut down while staying alive (as survivors waiting in the next rendezvous do); rank 2
is not party to the cut and waits on rank 0 (the ring's receive). Patched, rank 2 fails within milliseconds
(12 runs in 12 when the patch was made); stock, it waited the whole op timeout (5 in 5)."""
from __future__ import annotations

import os
import pathlib
import queue
import subprocess
import sys
import threading
import time

import pytest

from ringflow.training.rank.engines.horovod import has_gloo_op_timeout

hvd_runner = pytest.importorskip("horovod.runner.http.http_server")

RANK_SCRIPT = """
import os, signal, sys, time
import torch
import horovod.torch as hvd

hvd.init()
x = torch.ones(1000)
last = time.monotonic()
for i in range(100000):
    if hvd.rank() == 1 and i == 200:
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        hvd.allreduce(x, name="x")
    except Exception as err:  # HorovodInternalError: the dead peer, found
        print(f"failed-after {time.monotonic() - last:.3f} {type(err).__name__}", flush=True)
        os._exit(0)
    last = time.monotonic()
"""


# Every rank writes its connected TCP ports at iteration 5; at CUT_AT rank 0 shuts down its sockets whose far
# end is one of rank 1's ports. A rank whose allreduce fails prints when, shuts Horovod down and stays alive.
CUT_SCRIPT = """
import json, os, socket, sys, time
import torch
import horovod.torch as hvd


def connected_ports():
    inodes = {}
    for fd in os.listdir('/proc/self/fd'):
        try:
            link = os.readlink(f'/proc/self/fd/{fd}')
        except OSError:
            continue
        if link.startswith('socket:['):
            inodes[link[8:-1]] = int(fd)
    found = []
    for line in open('/proc/net/tcp').read().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes and fields[3] == '01':  # ESTABLISHED
            found.append((inodes[fields[9]], int(fields[1].split(':')[1], 16), int(fields[2].split(':')[1], 16)))
    return found


hvd.init()
rank, folder, cut_at = hvd.rank(), sys.argv[1], int(sys.argv[2])
x = torch.ones(1000)
for i in range(1000000):
    if i == 5:
        with open(os.path.join(folder, f'ports{rank}'), 'w') as fh:
            json.dump([local for _, local, _ in connected_ports()], fh)
    if rank == 0 and i == cut_at:
        with open(os.path.join(folder, 'ports1')) as fh:
            rank1 = set(json.load(fh))
        cut = time.time()
        for fd, _, far in connected_ports():
            if far in rank1:
                sock = socket.socket(fileno=fd)
                sock.shutdown(socket.SHUT_RDWR)
                sock.detach()
        print(f'cut {cut!r}', flush=True)
    try:
        hvd.allreduce(x, name='x')
    except Exception:
        print(f'failed {time.time()!r}', flush=True)
        hvd.shutdown()
        print('shut down', flush=True)
        time.sleep(600)
"""


def start_ranks(tmp_path: pathlib.Path, size: int, env: dict[str, str], script_text: str = RANK_SCRIPT,
                args: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    port = server.start()
    slots = get_host_assignments(parse_hosts(f"localhost:{size}"), size)
    server.init(slots)
    script = tmp_path / "allreduce_loop.py"
    script.write_text(script_text)
    procs = []
    for slot in slots:
        rank_env = os.environ | env | {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": "lo",
            "HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=rank_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def test_this_machines_horovod_carries_the_patch():
    import horovod

    assert has_gloo_op_timeout(horovod), "rebuild Horovod with docker/build-horovod.sh (make setup does)"
    assert "gloo-finalize-process-sets" in horovod.RINGFLOW_PATCHES, "rebuild Horovod (make setup does)"


@pytest.mark.job
def test_a_survivor_gives_up_on_a_dead_peer_after_the_collectives_timeout_not_the_rendezvous(tmp_path):
    procs = start_ranks(tmp_path, 3, {"HOROVOD_GLOO_TIMEOUT_SECONDS": "60", "HOROVOD_GLOO_OP_TIMEOUT_SECONDS": "1"})
    outputs = {}
    try:
        for rank in (0, 2):
            outputs[rank], _ = procs[rank].communicate(timeout=90)
    finally:
        for proc in procs:
            proc.kill()
    waits = [float(line.split()[1]) for out in outputs.values() for line in out.splitlines()
             if line.startswith("failed-after")]
    assert len(waits) == 2, outputs
    # Both waited out the collectives' 1 s (a margin for a loaded host), not the rendezvous's 60 s.
    assert all(0.9 < wait < 20 for wait in waits), (waits, outputs)


def lines_until(proc: subprocess.Popen, prefix: str, deadline: float) -> list[str]:
    """The rank's output lines up to and including the first that starts with `prefix` (what came by the deadline
    if none), read on a thread of their own so that a rank that prints nothing more cannot hold the test."""
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    seen = []
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if line.startswith(prefix):
            break
    return seen


@pytest.mark.job
def test_a_rank_that_shut_horovod_down_lets_a_peer_waiting_on_it_go_at_once(tmp_path):
    op_timeout = 30
    procs = start_ranks(tmp_path, 3, {"HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
                                      "HOROVOD_GLOO_OP_TIMEOUT_SECONDS": str(op_timeout)},
                        CUT_SCRIPT, (str(tmp_path), "50"))
    deadline = time.monotonic() + op_timeout + 60
    try:
        rank0 = lines_until(procs[0], "shut down", deadline)
        rank2 = lines_until(procs[2], "failed", deadline)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    cut = [float(line.split()[1]) for line in rank0 if line.startswith("cut ")]
    failed = [float(line.split()[1]) for line in rank2 if line.startswith("failed ")]
    assert cut and failed and rank0[-1].startswith("shut down"), (rank0, rank2)
    # Told by rank 0's closed connection (milliseconds; a margin for a loaded host), not by the op timeout.
    assert failed[0] - cut[0] < op_timeout / 3, (failed[0] - cut[0], rank0, rank2)
