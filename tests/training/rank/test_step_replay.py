"""The reader's side of replay (a minibatch with its row numbers; rows never served) and one rank's replay of a
step, in this process: the bad-rows dataset's non-finite step names its rows, a clean step is finite."""
import pytest
import pyarrow.parquet as pq
import torch

from ringflow.training.formats.config import ConfigError, ModelConfig, RowRef
from ringflow.training.rank.data import Cursor, PartitionData, epoch_order, to_tensors
from ringflow.training.rank.models import build_model
from ringflow.training.rank.replay import StepReplay
from ringflow.training.store import LocalFolderStore

from replay_data import huge_target_rows, write_bad_rows_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-rows")
    store = LocalFolderStore(str(root))
    manifest = write_bad_rows_shards(store)
    return root, store, manifest, huge_target_rows(str(root), manifest)


def reader(shards, skip_rows=(), batch_size=16):
    _, store, manifest, _ = shards
    return PartitionData(store, manifest, rank=1, world_size=2, batch_size=batch_size, skip_rows=skip_rows)


@pytest.mark.parametrize("cursor", [Cursor(0, 0), Cursor(0, 5), Cursor(2, 10)])
def test_minibatch_rows_is_the_served_minibatch_and_its_rows(shards, cursor):
    root, _, manifest, _ = shards
    data = reader(shards)
    served = {b: (x, y) for b, x, y in data.batches(seed=3, cursor=Cursor(cursor.epoch, 0))}
    x, y, rows = data.minibatch_rows(cursor, seed=3)
    assert torch.equal(x, served[cursor.batch][0]) and torch.equal(y, served[cursor.batch][1])
    assert (rows == epoch_order(data.group_rows, 3, cursor.epoch, 1)[cursor.batch * 16:(cursor.batch + 1) * 16]).all()
    file_x, _ = to_tensors(pq.read_table(f"{root}/{data.source.key}"), manifest.schema)
    assert torch.equal(x, file_x[torch.from_numpy(rows)])  # row r is row r of the partition file


def test_skipped_rows_are_never_served_and_every_other_row_keeps_its_minibatch(shards):
    _, _, _, bad = shards
    plain, skipping = reader(shards), reader(shards, skip_rows=bad)
    skipped = {r.row for r in bad}
    for epoch in (0, 1):
        order = epoch_order(plain.group_rows, 0, epoch, 1)
        got = list(skipping.batches(seed=0, cursor=Cursor(epoch, 0)))
        assert [b for b, _, _ in got] == list(range(plain.batches_per_epoch))  # as many steps as before
        for b, x, y in got:
            kept = [r for r in order[b * 16:(b + 1) * 16] if r not in skipped]
            assert len(x) == len(kept) and torch.isfinite(y).all() and (y.abs() < 1e20).all()
            x_kept, _, rows = skipping.minibatch_rows(Cursor(epoch, b), seed=0)
            assert list(rows) == kept and torch.equal(x_kept, x)
    resumed = list(skipping.batches(seed=0, cursor=Cursor(1, 4)))
    assert all(torch.equal(x, fx) for (_, x, _), (_, fx, _) in zip(resumed, got[4:]))


def test_skip_rows_outside_the_shards_are_refused(shards):
    with pytest.raises(ConfigError, match="which has 176 rows"):
        reader(shards, skip_rows=[RowRef("part-00001.parquet", 176)])
    with pytest.raises(ConfigError, match="not a partition of"):
        reader(shards, skip_rows=[RowRef("part-00009.parquet", 1)])


def test_a_minibatch_of_skipped_rows_only_is_refused(shards):
    data = reader(shards, skip_rows=[RowRef("part-00001.parquet", r) for r in range(176)], batch_size=16)
    with pytest.raises(ConfigError, match="skips every row of minibatch 0"):
        next(data.batches(seed=0, cursor=Cursor(0, 0)))


def make_model(manifest):
    schema = manifest.schema
    return lambda: build_model(ModelConfig(), schema.num_features, schema.num_outputs, schema.task)


def first_bad_minibatch(data, bad) -> tuple[Cursor, set[int]]:
    rows = {r.row for r in bad}
    order = epoch_order(data.group_rows, 0, 0, 1)
    for b in range(data.batches_per_epoch):
        found = rows & set(order[b * 16:(b + 1) * 16].tolist())
        if found:
            return Cursor(0, b), found
    raise AssertionError("no bad row in epoch 0")


def test_a_bad_rows_step_is_non_finite_again_and_its_rows_are_named(shards):
    _, _, manifest, bad = shards
    data = reader(shards)
    cursor, expected = first_bad_minibatch(data, bad)
    replay = StepReplay(make_model(manifest), data, seed=0, accumulation_steps=1, rank=1)
    report = replay.run(cursor.batch + 1, [cursor], None, None, deadline=float("inf"))
    assert report.nonfinite is True and report.complete and report.error is None
    assert {r.row for r in report.rows} == expected and {r.file for r in report.rows} == {"part-00001.parquet"}
    assert report.tests <= 2 * len(expected) * 4 + 2  # bisection: ~2 tests per level per bad row


def test_a_clean_step_replays_finite(shards):
    _, _, manifest, bad = shards
    data = reader(shards)
    order = epoch_order(data.group_rows, 0, 0, 1)
    clean = next(b for b in range(data.batches_per_epoch)
                 if not {r.row for r in bad} & set(order[b * 16:(b + 1) * 16].tolist()))
    report = StepReplay(make_model(manifest), data, 0, 1, 1).run(clean + 1, [Cursor(0, clean)], None, None, float("inf"))
    assert report.nonfinite is False and report.rows == () and report.tests == 0


def test_a_replay_that_fails_decides_nothing(shards):
    _, _, manifest, _ = shards

    def broken():
        raise RuntimeError("no model today")

    report = StepReplay(broken, reader(shards), 0, 1, 1).run(1, [Cursor(0, 0)], None, None, float("inf"))
    assert report.nonfinite is None and "no model today" in report.error


def test_an_engine_that_cannot_replay_says_so_and_keeps_the_verdict():
    from ringflow.training.health.verdict import Verdict
    from ringflow.training.rank.rank_run import RankRun
    from ringflow.training.rank.tensorflow_worker import TfTrainer

    assert TfTrainer.replayed is RankRun.replayed  # the TensorFlow ranks: their model and step are Keras's
    verdict = Verdict("NONFINITE", "NaN/Inf in rank(s) [1] at step 3", {"step": 3, "ranks": [1]})
    said = RankRun().replayed(verdict)
    assert said.status == "NONFINITE" and said.reason == verdict.reason and said.evidence["ranks"] == [1]
    assert "replay" not in said.evidence and said.evidence["replay_unavailable"].startswith("replay: not supported")
