"""The Horovod object broadcast (rank/engines/horovod_objects.py): the root's object on every rank, bit for bit,
through two broadcasts of the sizes and bytes Horovod's own broadcast_object would move."""
from __future__ import annotations

import pytest
import torch

from ringflow.training.rank.engines import horovod_objects
from ringflow.training.rank.engines.horovod_objects import as_tensor, broadcast_object, from_tensor


class TwoRanks:
    """Two ranks' hvd, run one after the other: the root's call records what each broadcast sent, the other's
    call receives it (what Horovod's broadcast_ does in place)."""

    def __init__(self):
        self.sent: dict[str, torch.Tensor] = {}
        self.names: list[str] = []

    def rank_view(self, rank: int):
        world = self

        class Hvd:
            @staticmethod
            def rank():
                return rank

            @staticmethod
            def size():
                return 2

            @staticmethod
            def broadcast_(tensor, root_rank, name):
                world.names.append(name)
                if rank == root_rank:
                    world.sent[name] = tensor.clone()
                else:
                    assert tensor.shape == world.sent[name].shape and tensor.dtype == world.sent[name].dtype, name
                    tensor.copy_(world.sent[name])
                return tensor

        return Hvd()


def training_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 64)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7, "cursor": (0, 3, None)}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_pickled_object_round_trips_through_its_bytes_tensor():
    state = training_state()
    tensor = as_tensor(state)
    assert tensor.dtype == torch.uint8 and tensor.dim() == 1 and tensor.numel() > 64 * 32 * 4
    assert same(from_tensor(tensor), state)


@pytest.mark.parametrize("root", [0, 1])
def test_every_rank_gets_the_roots_object_the_root_keeps_its_own(root):
    world, state = TwoRanks(), training_state()
    other = 1 - root
    kept = broadcast_object(world.rank_view(root), state, root_rank=root, name="ringflow.commit")
    got = broadcast_object(world.rank_view(other), None, root_rank=root, name="ringflow.commit")
    assert kept is state
    assert same(got, state) and got is not state
    # Two collectives a call, named as Horovod names its own (the size, then the bytes), on both ranks alike.
    assert world.names == ["ringflow.commit.sz", "ringflow.commit.t0"] * 2
    assert world.sent["ringflow.commit.sz"].dtype == torch.int64


def test_a_rank_alone_keeps_its_object_without_a_broadcast():
    """An elastic survivor left alone: its own commit, not pickled and sent to nobody."""
    class Alone:
        @staticmethod
        def size():
            return 1

        @staticmethod
        def rank():
            return 0

        @staticmethod
        def broadcast_(tensor, root_rank, name):
            raise AssertionError(f"{name} broadcast to nobody")

    state = training_state()
    assert broadcast_object(Alone(), state, root_rank=0, name="ringflow.commit") is state


def test_a_large_object_goes_in_pieces_each_one_message(monkeypatch):
    """Each piece must arrive within the collectives' timeout on a slow link: none larger than CHUNK_BYTES."""
    monkeypatch.setattr(horovod_objects, "CHUNK_BYTES", 4096)
    world, state = TwoRanks(), training_state()
    broadcast_object(world.rank_view(0), state, root_rank=0, name="c")
    got = broadcast_object(world.rank_view(1), None, root_rank=0, name="c")
    pieces = [name for name in world.sent if name.startswith("c.t")]
    assert len(pieces) == -(-as_tensor(state).numel() // 4096) > 1
    assert all(world.sent[name].numel() <= 4096 for name in pieces)
    assert same(got, state)
