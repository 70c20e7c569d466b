"""promote_run on user scripts' runs: the gate, the registry and rollback as for ringflow's own loop, and the
promoted version's MODEL.json says how to load the model (the script, its bundle, engine, state file)."""
from __future__ import annotations

import torch
from evaluated_runs import make_script_run

from ringflow.training.core.evaluate import evaluate_run
from ringflow.training.core.gate import build_gate
from ringflow.training.core.promotion import promote_run
from ringflow.training.core.registry.model_registry import ModelRegistry
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.formats.script_checkpoint import HOW_TO_LOAD, TORCH_FILE
from ringflow.training.store import LocalFolderStore


def test_script_runs_pass_the_gate_promote_with_how_to_load_them_and_roll_back(tmp_path, digits_manifest):
    store = LocalFolderStore(str(tmp_path / "store"))
    gate = build_gate(metric="accuracy", mode="max")

    def trained(run_id, accuracy, seed):
        model, _ = make_script_run(store.child(f"runs/{run_id}"), digits_manifest,
                                   {"accuracy": accuracy, "loss": 1 - accuracy}, seed=seed)
        evaluate_run(RunFolder(store.child(f"runs/{run_id}")))
        return model, f"{store.uri}/runs/{run_id}"

    first, first_uri = trained("r1", 0.90, seed=1)
    one = promote_run(store, store.uri, first_uri, "digits-script", gate)
    _, worse_uri = trained("r2", 0.80, seed=2)
    worse = promote_run(store, store.uri, worse_uri, "digits-script", gate)
    _, better_uri = trained("r3", 0.95, seed=3)
    better = promote_run(store, store.uri, better_uri, "digits-script", gate)

    assert (one.promoted, one.version) == (True, 1)
    assert not worse.promoted and "0.8" in worse.reason
    assert (better.promoted, better.version) == (True, 2)
    registry = ModelRegistry(store)
    assert registry.rollback("digits-script").version == 1

    script = registry.model_info("digits-script", 1)["script"]
    assert script == {"script": "train.py", "bundle_sha256": "ab" * 32,
                      "bundle": f"{first_uri}/code/{'ab' * 32}.tar.gz", "engine": "ddp", "state_file": TORCH_FILE,
                      "load": HOW_TO_LOAD[TORCH_FILE]}
    # Loaded as MODEL.json says: torch.load(weights_only=True), the script's model, state["model"].
    loaded = torch.nn.Linear(64, 10)
    loaded.load_state_dict(torch.load(tmp_path / "store/models/digits-script/v1" / TORCH_FILE,
                                      weights_only=True)["model"])
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), first.state_dict().values()))
