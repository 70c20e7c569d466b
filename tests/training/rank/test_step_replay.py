"""The reader's side of replay (a micro-batch with its (file, row) ids; rows never served) and one rank's replay of a
step, in this process: the bad-rows dataset's non-finite step names its rows, a clean step is finite."""
import pytest
import pyarrow.parquet as pq
import torch

from ringflow.training.formats.config import ConfigError, ModelConfig, RowRef
from ringflow.training.rank.data import Cursor, PartitionData, to_tensors
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


def served(data, seed, cursor):
    """What batches() serves from `cursor` on: (b, x, y, (file, row) ids) of each micro-batch."""
    return [(b, x, y, data.row_ids.copy()) for b, x, y in data.batches(seed=seed, cursor=cursor)]


def keys(data, ids):
    return [(data.entries[int(f)].key, int(r)) for f, r in ids]


@pytest.mark.parametrize("cursor", [Cursor(0, 0), Cursor(0, 3), Cursor(2, 4)])
def test_minibatch_rows_is_the_served_minibatch_and_its_rows(shards, cursor):
    root, _, manifest, _ = shards
    data = reader(shards)
    by_batch = {b: (x, y, ids) for b, x, y, ids in served(data, 3, Cursor(cursor.epoch, 0))}
    x, y, rows = data.minibatch_rows(cursor, seed=3)
    assert torch.equal(x, by_batch[cursor.batch][0]) and torch.equal(y, by_batch[cursor.batch][1])
    assert (rows == by_batch[cursor.batch][2]).all() and len(rows) == 16
    for i, (key, row) in enumerate(keys(data, rows)):  # each id is that row of that partition file
        file_x, _ = to_tensors(pq.read_table(f"{root}/{key}"), manifest.schema)
        assert torch.equal(x[i], file_x[row])


def test_minibatch_rows_follows_a_settled_cursor_on_another_world_size(shards):
    """A replay after a resume on another number of workers: the cursor's deal is of the epoch's unseen rows."""
    _, store, manifest, _ = shards
    two = reader(shards)
    settled = two.settled(Cursor(1, 2))
    assert settled.remaining is not None and settled.batch == 0
    three = PartitionData(store, manifest, rank=2, world_size=3, batch_size=16)
    by_batch = {b: (x, ids) for b, x, _, ids in served(three, 3, settled)}
    for b in (0, 1, max(by_batch)):
        x, _, rows = three.minibatch_rows(Cursor(settled.epoch, b, settled.remaining), seed=3)
        assert torch.equal(x, by_batch[b][0]) and (rows == by_batch[b][1]).all()


def test_skipped_rows_are_never_served_and_every_other_row_keeps_its_minibatch(shards):
    _, _, _, bad = shards
    plain, skipping = reader(shards), reader(shards, skip_rows=bad)
    skipped = {(r.file, r.row) for r in bad}
    hit = 0
    for epoch in (0, 1):
        before = served(plain, 0, Cursor(epoch, 0))
        got = served(skipping, 0, Cursor(epoch, 0))
        assert [b for b, *_ in got] == [b for b, *_ in before]  # as many steps as before
        for (b, x, y, ids), (_, _, _, plain_ids) in zip(got, before):
            kept = [k for k in keys(plain, plain_ids) if k not in skipped]
            hit += len(kept) < len(plain_ids)
            assert keys(skipping, ids) == kept and len(x) == len(kept)
            assert torch.isfinite(y).all() and (y.abs() < 1e20).all()
            x_kept, _, rows = skipping.minibatch_rows(Cursor(epoch, b), seed=0)
            assert keys(skipping, rows) == kept and torch.equal(x_kept, x)
    assert hit, "no bad row in rank 1's run: the test would prove nothing"
    resumed = served(skipping, 0, Cursor(1, 4))
    assert all(torch.equal(x, fx) for (_, x, _, _), (_, fx, _, _) in zip(resumed, got[4:]))


def test_skip_rows_outside_the_shards_are_refused(shards):
    _, _, manifest, _ = shards
    part = manifest.partitions[0]
    with pytest.raises(ConfigError, match=f"which has {part.rows} rows"):
        reader(shards, skip_rows=[RowRef(part.key, part.rows)])
    with pytest.raises(ConfigError, match="not a partition of"):
        reader(shards, skip_rows=[RowRef("part-00009.parquet", 1)])


def test_a_minibatch_of_skipped_rows_only_is_served_empty(shards):
    """It keeps its place (the loop trains it as an empty micro-batch: a zero loss that joins the all-reduce)."""
    plain = reader(shards)
    first = served(plain, 0, Cursor(0, 0))
    data = reader(shards, skip_rows=[RowRef(k, r) for k, r in keys(plain, first[0][3])])
    got = served(data, 0, Cursor(0, 0))
    assert len(got[0][1]) == 0 and len(got[0][3]) == 0 and len(got) == len(first)
    assert torch.equal(got[1][1], first[1][1])


def make_model(manifest):
    schema = manifest.schema
    return lambda: build_model(ModelConfig(), schema.num_features, schema.num_outputs, schema.task)


def first_bad_minibatch(data, bad) -> tuple[Cursor, set[tuple[str, int]]]:
    rows = {(r.file, r.row) for r in bad}
    for b, _, _, ids in served(data, 0, Cursor(0, 0)):
        found = rows & set(keys(data, ids))
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
    assert {(r.file, r.row) for r in report.rows} == expected
    assert report.tests <= 2 * len(expected) * 4 + 2  # bisection: ~2 tests per level per bad row


def test_a_clean_step_replays_finite(shards):
    _, _, manifest, bad = shards
    data = reader(shards)
    rows = {(r.file, r.row) for r in bad}
    clean = next(b for b, _, _, ids in served(data, 0, Cursor(0, 0)) if not rows & set(keys(data, ids)))
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
