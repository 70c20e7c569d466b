"""Where a rank computes and in what precision (training/rank/devices.py): the decision as a table, the
precision's autocast and loss scaling on the CPU, device-independent checkpoints, and a short bf16
training run of the real Trainer in one process (a Gloo world of one on 127.0.0.1).

The GPU half (NCCL, pinned-memory copies, fp16) runs where a GPU exists: bench/gpu_check.py, and the
test below marked for CUDA."""
import gc
import io

import pytest
import torch

from ringflow.training.formats.config import ConfigError, JobConfig
from ringflow.training.rank.devices import Placement, PlacementError, Precision, choose_placement, to_device
from ringflow.training.rank.training_state import TrainingState, on_cpu

CPU_DDP = Placement("cpu", "gloo", None, False, False)


@pytest.mark.parametrize("gpus, local_rank, engine, precision, expected", [
    # No GPU: the CPU, Gloo for DDP, Horovod's own controller; bf16 autocasts on the CPU too.
    (0, 0, "ddp", "fp32", Placement("cpu", "gloo", None, False, False)),
    (0, 3, "ddp", "bf16", Placement("cpu", "gloo", "bfloat16", False, False)),
    (0, 1, "horovod", "fp32", Placement("cpu", None, None, False, False)),
    (0, 0, "horovod", "bf16", Placement("cpu", None, "bfloat16", False, False)),
    # A GPU per local rank: NCCL for CUDA tensors (Gloo still for the CPU ones), pinned batches.
    (1, 0, "ddp", "fp32", Placement("cuda:0", "cpu:gloo,cuda:nccl", None, False, True)),
    (8, 5, "ddp", "bf16", Placement("cuda:5", "cpu:gloo,cuda:nccl", "bfloat16", False, True)),
    (2, 1, "ddp", "fp16", Placement("cuda:1", "cpu:gloo,cuda:nccl", "float16", True, True)),
    (2, 1, "horovod", "fp32", Placement("cuda:1", None, None, False, True)),
    (4, 0, "horovod", "fp16", Placement("cuda:0", None, "float16", True, True)),
])
def test_placement(gpus, local_rank, engine, precision, expected):
    assert choose_placement(gpus, local_rank, engine, precision) == expected


@pytest.mark.parametrize("gpus, local_rank, engine, precision, nccl, error, says", [
    (0, 0, "ddp", "fp16", True, ConfigError, "config field 'precision': is 'fp16' but this rank has no GPU; use \"bf16\""),
    (0, 0, "horovod", "fp16", True, ConfigError, "fp16 needs a CUDA GPU"),
    (2, 2, "ddp", "fp32", True, PlacementError, "local rank 2 on a host whose ranks see 2 GPU(s)"),
    (1, 3, "horovod", "bf16", True, PlacementError, "start at most 1 ranks per host"),
    (1, 0, "horovod", "fp32", False, PlacementError, "Horovod was built without NCCL"),
    (0, 0, "horovod", "fp32", False, None, None),        # without a GPU Horovod needs no NCCL
    (1, 0, "ddp", "fp32", False, None, None),            # DDP brings its own NCCL
    (1, -1, "ddp", "fp32", True, PlacementError, "no valid LOCAL_RANK"),
    (1, 0, "ddp", "fp8", True, ConfigError, "use one of ('fp32', 'bf16', 'fp16')"),
    (1, 0, "jax", "fp32", True, ConfigError, "config field 'engine'"),
])
def test_placement_refusals_say_what_to_change(gpus, local_rank, engine, precision, nccl, error, says):
    if error is None:
        choose_placement(gpus, local_rank, engine, precision, horovod_nccl=nccl)
        return
    with pytest.raises(error) as err:
        choose_placement(gpus, local_rank, engine, precision, horovod_nccl=nccl)
    assert says in str(err.value)


def test_a_cpu_batch_stays_where_it_is():
    x = torch.randn(4, 3)
    assert to_device(x, CPU_DDP) is x


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_bf16_autocasts_the_forward_and_keeps_the_module_and_its_keys():
    ref, model = mlp(), mlp()
    inside = []
    model[0].register_forward_hook(lambda _m, _i, out: inside.append(out.dtype))
    keys = list(model.state_dict())
    same = Precision(choose_placement(0, 0, "ddp", "bf16")).prepare(model)
    x = torch.randn(5, 8)
    out = same(x)
    assert same is model and list(model.state_dict()) == keys  # checkpoints look the same in any precision
    assert inside == [torch.bfloat16] and out.dtype == torch.float32  # the loss is taken in float32
    assert torch.allclose(out, ref(x), atol=5e-2) and not torch.equal(out, ref(x))


def test_fp32_leaves_the_forward_alone():
    model = mlp()
    forward = model.forward
    Precision(choose_placement(0, 0, "horovod", "fp32")).prepare(model)
    assert model.forward == forward and "forward" not in vars(model)


def scaled_cpu_precision() -> Precision:
    # fp16's loss scaling without fp16 (refused on the CPU): GradScaler's arithmetic alone, on the CPU.
    return Precision(Placement("cpu", "gloo", None, True, False))


def test_loss_scaling_scales_the_gradient_but_not_the_loss_and_unscales_after_the_all_reduce():
    ref, model = mlp(), mlp()
    precision = scaled_cpu_precision()
    # The output's gradient hook is what prepare() installs for fp16; without autocast here, apply it directly.
    from ringflow.training.rank.devices import _full_precision

    x, y = torch.randn(6, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    loss = torch.nn.functional.cross_entropy(_full_precision(model(x), precision.scaler), y)
    loss.backward()
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    scale = precision.scaler.get_scale()
    assert scale == 2.0 ** 16 and float(loss.detach()) == pytest.approx(float(torch.nn.functional.cross_entropy(ref(x).detach(), y)))
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, r.grad * scale, rtol=1e-4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision.unscale(optimizer)  # the engines call it once the all-reduce is done
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, r.grad, rtol=1e-4, atol=1e-7)
    before = [p.detach().clone() for p in model.parameters()]
    precision.step(optimizer)
    assert precision.skipped_steps == 0 and precision.scaler.get_scale() == scale
    assert not torch.equal(before[0], next(model.parameters()))


def test_an_overflowed_fp16_step_is_skipped_and_the_health_monitor_sees_no_inf():
    model = mlp()
    precision = scaled_cpu_precision()
    from ringflow.training.rank.devices import _full_precision

    loss = _full_precision(model(torch.randn(2, 8)), precision.scaler).sum()
    loss.backward()
    next(model.parameters()).grad[0, 0] = float("inf")  # what float16 does to a too-large scaled gradient
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    precision.unscale(optimizer)
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    precision.step(optimizer)
    assert precision.skipped_steps == 1 and precision.scaler.get_scale() == 2.0 ** 15  # scale lowered
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))  # the step was skipped


def test_on_cpu_copies_every_tensor_of_a_state_and_keeps_its_shape():
    p = torch.nn.Parameter(torch.ones(2))
    state = {"a": [p, (torch.zeros(1), 3)], "b": {"c": "x"}}
    out = on_cpu(state)
    assert out["b"] == {"c": "x"} and out["a"][1][1] == 3 and isinstance(out["a"][1], tuple)
    assert not out["a"][0].requires_grad and torch.equal(out["a"][0], p.detach())


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainingState:
    return TrainingState(model=model.state_dict(), optimizer=optimizer.state_dict(), cursor=(0, 1), step=1,
                         torch_rng=torch.get_rng_state())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: a checkpoint written from CUDA tensors")
def test_a_gpu_checkpoint_holds_cpu_tensors_and_resumes_on_the_cpu():
    model = mlp().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    optimizer.step()
    data = state_of(model, optimizer).to_bytes()
    raw = torch.load(io.BytesIO(data), weights_only=True)  # no map_location: where the tensors were saved
    tensors = [*raw["model"].values(), *(t for s in raw["optimizer"]["state"].values() for t in s.values())]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    cpu_model = mlp()
    cpu_optimizer = torch.optim.Adam(cpu_model.parameters())
    state = TrainingState.from_bytes(data, "gpu")
    cpu_model.load_state_dict(state.model)
    cpu_optimizer.load_state_dict(state.optimizer)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(model.parameters(), cpu_model.parameters()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: batches copied from pinned memory")
def test_batches_reach_the_gpu_from_pinned_memory_unchanged(tmp_path, monkeypatch):
    from ringflow.training.core import sharding
    from ringflow.training.rank.data import Cursor, PartitionData
    from ringflow.training.formats.datasets import load_builtin
    from ringflow.training.formats.manifest import load_manifest
    from ringflow.training.store import LocalFolderStore

    monkeypatch.setattr(sharding, "ROW_GROUP_BYTES", (64 * 4 + 8) * 32)  # row groups of 32 digits
    sharding.write_shards(load_builtin("digits"), LocalFolderStore(str(tmp_path)), target="target",
                          num_partitions=1, batch_size=32)
    manifest, store = load_manifest(str(tmp_path / "manifest.json"))
    placement = choose_placement(torch.cuda.device_count(), 0, "ddp", "fp32")
    # Windows of one 32-row group and batches of 48: every other batch spans two windows.
    on_cpu_data = PartitionData(store, manifest, 0, 1, 48, window=1)
    on_gpu_data = PartitionData(store, manifest, 0, 1, 48, window=1, placement=placement)
    assert len(on_cpu_data.group_rows) > 1
    pairs = list(zip(on_cpu_data.batches(0, Cursor()), on_gpu_data.batches(0, Cursor())))
    assert len(pairs) == on_cpu_data.batches_per_epoch
    for (b, x, y), (b2, gx, gy) in pairs:
        assert b == b2 and gx.device == torch.device(placement.device)
        assert torch.equal(x, gx.cpu()) and torch.equal(y, gy.cpu())


@pytest.fixture
def one_partition(tmp_path_factory) -> str:
    from ringflow.training.formats.datasets import load_builtin
    from ringflow.training.core.sharding import write_shards
    from ringflow.training.store import LocalFolderStore

    out = tmp_path_factory.mktemp("digits-one")
    write_shards(load_builtin("digits"), LocalFolderStore(str(out)), target="target", num_partitions=1, batch_size=64)
    return str(out / "manifest.json")


def train_in_process(monkeypatch, manifest: str, run: str, precision: str):
    from ringflow.training.rank.engines import start_engine
    from run_folder_files import read_health
    from ringflow.training.formats.run_folder import RunFolder
    from ringflow.training.core.launcher import free_port
    from ringflow.training.store import LocalFolderStore
    from ringflow.training.rank.worker import Trainer

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
                        "RINGFLOW_ENGINE": "ddp", "RINGFLOW_TORCH_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    cfg = JobConfig.from_dict({"manifest_uri": manifest, "run_uri": run, "epochs": 1, "batch_size": 64,
                               "precision": precision, "log_every_steps": 1000, "checkpoint": {"every_steps": 1000},
                               "health": {"every_steps": 5, "stall_seconds": 60}})
    engine = start_engine(cfg)
    try:
        assert engine.placement.device == "cpu"
        code = Trainer(cfg, engine).train()
    finally:
        engine.shutdown()
    # The loop ran Python's collector on its schedule and gave it back (callbacks/garbage_collection.py).
    assert gc.isenabled() and gc.get_freeze_count() == 0
    loaded = RunFolder(LocalFolderStore(run)).checkpoints().latest_valid()
    start = read_health(LocalFolderStore(run))[0]
    return code, TrainingState.from_bytes(loaded.files["state.pt"], run), loaded.manifest.meta["loss"], start


def test_a_short_bf16_run_trains_on_the_cpu(monkeypatch, one_partition, tmp_path):
    code32, fp32, loss32, _ = train_in_process(monkeypatch, one_partition, str(tmp_path / "fp32"), "fp32")
    code16, bf16, loss16, start = train_in_process(monkeypatch, one_partition, str(tmp_path / "bf16"), "bf16")
    assert code32 == code16 == 0
    assert start["precision"] == "bf16" and start["device"] == "cpu"
    assert all(t.dtype == torch.float32 for t in bf16.model.values())  # master weights stay float32
    assert any(not torch.equal(bf16.model[k], fp32.model[k]) for k in fp32.model)  # it ran in bfloat16
    # and learned as fp32 did (the loss starts at ln 10 = 2.3 for ten classes)
    assert loss16 < 0.3 and abs(loss16 - loss32) < 0.05
