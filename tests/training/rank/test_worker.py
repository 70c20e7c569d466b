"""worker.Trainer's start, in this process on one DDP rank: the first window loads as soon as the state to resume
from is known, a start that fails after that stops the load, and rank 0's broadcast of the state is skipped only
where every rank restored the same one (an elastic DDP restart's peer copy: ddp_elastic.PeerCopyRun)."""
from __future__ import annotations

import pytest
import torch

from ringflow.training.formats.config import JobConfig
from ringflow.training.rank.commits import Commit
from ringflow.training.rank.data import PartitionData
from ringflow.training.rank.rank_start import RankStart
from ringflow.training.rank.training_state import TrainingState
from ringflow.training.rank.worker import Trainer


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> str:
    from ringflow.training.core.sharding import write_shards
    from ringflow.training.formats.datasets import load_builtin
    from ringflow.training.store import LocalFolderStore

    out = tmp_path_factory.mktemp("digits-worker")
    write_shards(load_builtin("digits"), LocalFolderStore(str(out)), target="target", num_partitions=1, batch_size=64)
    return str(out / "manifest.json")


@pytest.fixture(autouse=True)
def starts(monkeypatch):
    """Every rank start a Trainer begins here, ended with the test: a Trainer that never trains leaves its
    watchdog running, which would find a stall a minute later and end the test process (os._exit, code 5)."""
    begun = []
    begin = RankStart.begin.__func__

    def recorded(cls, *args, **kwargs):
        begun.append(begin(cls, *args, **kwargs))
        return begun[-1]

    monkeypatch.setattr(RankStart, "begin", classmethod(recorded))
    yield begun
    for start in begun:
        start.liveness.stop()
        if start.health_log is not None:
            start.health_log.close()
        start.liveness.watchdog.join(5)
        assert not start.liveness.watchdog.is_alive()


@pytest.fixture
def engine(monkeypatch, manifest, tmp_path):
    from ringflow.training.core.launcher import free_port
    from ringflow.training.rank.engines import start_engine

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
                        "RINGFLOW_ENGINE": "ddp", "RINGFLOW_TORCH_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    started = start_engine(config(manifest, tmp_path / "engine"))
    yield started
    started.shutdown()


def config(manifest: str, run) -> JobConfig:
    return JobConfig.from_dict({"manifest_uri": manifest, "run_uri": str(run), "engine": "ddp", "epochs": 1,
                                "batch_size": 64, "elastic": {}, "health": {"stall_seconds": 60}})


class Restart:
    """What a Trainer reads of an elastic run (ddp_elastic.PeerCopyRun), resuming from `committed`."""

    host_ranges = None
    resumed_from = None
    round = 1
    checkpoint_writer = None

    def __init__(self, committed: Commit, restored_alike: bool):
        self.state = type("State", (), {"committed": committed})()
        self.restored_alike = restored_alike


@pytest.mark.parametrize("restored_alike, broadcasts", [(True, 0), (False, 1)])
def test_rank_0_s_state_is_broadcast_unless_every_rank_restored_the_same(manifest, engine, tmp_path, monkeypatch,
                                                                           restored_alike, broadcasts):
    calls = []
    monkeypatch.setattr(engine, "broadcast_state", lambda model, optimizer: calls.append("broadcast"))
    fresh = Trainer(config(manifest, tmp_path / "fresh"), engine)
    assert calls == ["broadcast"] and fresh.data._ahead is not None  # its first window loads already
    fresh.data.close()
    state = TrainingState(model=fresh.model.state_dict(), optimizer=fresh.optimizer.state_dict(), cursor=(0, 3),
                          step=3, torch_rng=torch.get_rng_state())
    calls.clear()
    resumed = Trainer(config(manifest, tmp_path / "resumed"), engine, elastic=Restart(Commit(state, {}), restored_alike))
    assert len(calls) == broadcasts and (resumed.step, resumed.cursor.batch) == (3, 3)
    resumed.data.close()


def test_a_start_that_fails_after_the_first_window_began_loading_stops_the_load(manifest, engine, tmp_path,
                                                                                  monkeypatch):
    closed = []
    close = PartitionData.close
    monkeypatch.setattr(PartitionData, "close", lambda self: closed.append(self._ahead is not None) or close(self))

    def peer_gone(model, optimizer):
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(engine, "distribute", peer_gone)
    with pytest.raises(RuntimeError, match="closed by peer"):
        Trainer(config(manifest, tmp_path / "run"), engine)
    assert closed == [True]

