"""A run checkpointed on 2 workers resumes on 3, then on 1: a rank is SIGKILLed in each of the first two tries,
and the next try, on another number of workers, resumes from the newest checkpoint. Every training row of each
epoch is trained on exactly once (the ranks' row logs, callbacks/row_log.py, less the steps after the checkpoint
each resume went back to), and each change of world size rescaled the accumulation and the learning rate, logged
and recorded in the result and the health records.

Under DDP (torchrun) only: the plan of a world-size change and the deal of rows to ranks are the engines' shared
code (rank/world_size_change.py, rank/worker.py, the partition stream); an engine only takes the accumulation it
is given, and Horovod's accumulation is proven equal to DDP's (test_ddp_training.py::
test_accumulated_passes_match_horovods), Horovod's kill and resume by test_resume.py."""
import json
import re

import pytest

from ringflow.training.formats.manifest import ShardManifest

pytestmark = pytest.mark.job

CHECKPOINT_NAME = re.compile(r"resuming from checkpoint ckpt-(\d+)")


def trained_rows(folder, up_to_step):
    """(epoch, file, row) of every row the ranks logged in `folder` for steps <= up_to_step."""
    out = []
    for path in sorted(folder.glob("rows-*.jsonl")):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            if doc["step"] <= up_to_step:
                out += [(doc["epoch"], f, r) for f, r in doc["rows"]]
    return out


@pytest.fixture(scope="module", params=["ddp"])
def elastic_run(request, module_jobs):
    """Three tries of one run: 2 workers (rank 1 killed at step 13), 3 workers (rank 2 killed at step 24),
    1 worker to the end. Returns (config, [(row log folder, output)], resumed-from steps)."""
    engine, root = request.param, module_jobs.root
    cfg = module_jobs.config(f"elastic-{engine}", engine=engine, checkpoint={"every_steps": 5})
    tries = []
    for n, (np, faults) in enumerate([(2, [{"kind": "crash", "rank": 1, "step": 13}]),
                                      (3, [{"kind": "crash", "rank": 2, "step": 24}]), (1, [])]):
        folder = root / f"rows-{engine}-{n}"
        code, out = module_jobs.run(cfg | {"faults": faults, "row_log_dir": str(folder)}, np=np)
        assert (code == 0) == (not faults), out
        tries.append((folder, out))
    resumed = [int(CHECKPOINT_NAME.search(out).group(1)) for _, out in tries[1:]]
    return cfg, tries, resumed


def test_every_row_of_each_epoch_is_trained_on_exactly_once(elastic_run, module_jobs):
    cfg, tries, resumed = elastic_run
    final = module_jobs.result(cfg)
    assert final.succeeded and resumed[0] <= 13 and resumed[1] <= 24
    seen = []
    for (folder, _), up_to in zip(tries, resumed + [final.step]):
        seen += trained_rows(folder, up_to)
    manifest = ShardManifest.from_json(open(cfg["manifest_uri"]).read())
    every_row = sorted((f, r) for f, p in enumerate(manifest.partitions) for r in range(p.rows))
    for epoch in range(cfg["epochs"]):
        assert sorted((f, r) for e, f, r in seen if e == epoch) == every_row, f"epoch {epoch}"
    assert {e for e, _, _ in seen} == set(range(cfg["epochs"]))


def test_each_change_rescaled_the_accumulation_and_learning_rate_and_said_so(elastic_run, module_jobs):
    cfg, tries, _ = elastic_run
    changes = module_jobs.result(cfg).world_size_changes
    assert [(c["from_world_size"], c["to_world_size"], c["accumulation_steps"]) for c in changes] == [
        (2, 3, 1), (3, 1, 2)]
    assert [c["lr_factor"] for c in changes] == pytest.approx([1.5, 2 / 3])
    assert all(c["base_global_batch"] == 64 for c in changes)
    assert "world size 2 -> 3" in tries[1][1] and "world size 3 -> 1" in tries[2][1]
    starts = [r for r in module_jobs.health(cfg) if r["type"] == "start"]
    assert [s.get("world_size_change", {}).get("to_world_size") for s in starts][-2:] == [3, 1]
