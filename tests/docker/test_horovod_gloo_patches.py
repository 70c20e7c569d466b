"""docker/build-horovod.sh's gloo-op-timeout patch, on the Horovod this machine built with it: once connected,
Gloo's collectives give up on a dead peer after HOROVOD_GLOO_OP_TIMEOUT_SECONDS, while the rendezvous keeps
HOROVOD_GLOO_TIMEOUT_SECONDS (ElasticConfig.environment sets both).

Three Horovod ranks (Gloo controller, started here as horovodrun's gloo_run starts them: a rendezvous server
and the slot variables) all-reduce in a loop; rank 1 SIGSTOPs itself, a peer that answers nothing and whose
sockets stay open, so the others find it only by the collectives' timeout: with the patch 1 s, not the
rendezvous's 60 (a stock Horovod waits those 60)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

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


def start_ranks(tmp_path: pathlib.Path, size: int, env: dict[str, str]) -> list[subprocess.Popen]:
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    port = server.start()
    slots = get_host_assignments(parse_hosts(f"localhost:{size}"), size)
    server.init(slots)
    script = tmp_path / "allreduce_loop.py"
    script.write_text(RANK_SCRIPT)
    procs = []
    for slot in slots:
        rank_env = os.environ | env | {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": "lo",
            "HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=rank_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def test_this_machines_horovod_carries_the_patch():
    import horovod

    assert has_gloo_op_timeout(horovod), "rebuild Horovod with docker/build-horovod.sh (make setup does)"


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
