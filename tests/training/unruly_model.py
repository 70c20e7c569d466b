"""A model factory whose ranks misbehave the way a stop has to cope with (imported by the ranks through
PYTHONPATH; used by backends/test_local_stop.py and test_launcher_stop.py).

Every rank writes its pid to `<out>.<rank>`.
ignore_sigterm_rank: that rank ignores SIGTERM.
stray_rank: that rank starts a process that leaves the job's session and tree (setsid, then a double fork:
its parent exits at once), ignores SIGTERM and sleeps; its pid goes to `<out>.stray`. Its output goes
nowhere, so no launcher waits on its pipes: the job itself ends cleanly.
"""
import os
import signal
import subprocess
import sys

import torch

STRAY = """
import os, signal, sys, time
if os.fork():
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def build(num_features, num_outputs, task, out, ignore_sigterm_rank=-1, stray_rank=-1):
    me = rank()
    with open(f"{out}.{me}", "w") as f:
        f.write(str(os.getpid()))
    if me == ignore_sigterm_rank:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if me == stray_rank:
        subprocess.run([sys.executable, "-c", STRAY, f"{out}.stray"], start_new_session=True, check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return torch.nn.Linear(num_features, num_outputs), torch.nn.functional.cross_entropy
