"""A user script's checkpoint in a run folder, as the control plane reads it (no torch, no numpy): the state file
it holds (rank/script_state.py writes and reads it), what its manifest's meta says of the script, and what a
promoted version of it says of how to load it (MODEL.json's "script" section)."""
from __future__ import annotations

from typing import Any, Mapping

from .code_bundle import bundle_key

TORCH_FILE, NUMPY_FILE = "script_state.pt", "script_state.npz"
STATE_FILES = (TORCH_FILE, NUMPY_FILE)
# A script run's checkpoint meta: the script (its presence says the checkpoint is a script's), the sha256 of the
# code bundle it ran from, and the metrics it reported on the eval split (api.report_eval; the final one only).
SCRIPT_META, BUNDLE_META, EVAL_META = "script", "bundle_sha256", "eval_metrics"
# How a user loads a promoted script model's state file, by its name (MODEL.json's "script" section).
HOW_TO_LOAD = {
    TORCH_FILE: "state = torch.load(path, weights_only=True): the dict the script handed to "
                "ringflow.training.api.report(checkpoint=...); build the script's model (its bundle) and "
                "model.load_state_dict(state['model']) (the key the script used)",
    NUMPY_FILE: "state = ringflow.training.rank.script_state.load_state('script_state.npz', data, path) "
                "(numpy .npz of arrays, the containers as JSON in '__tree__', no pickle): the dict the script "
                "handed to ringflow.training.api.report(checkpoint=...); set it into the script's model "
                "(e.g. model.set_weights(state['weights']), the key the script used)",
}


def promoted_script(meta: Mapping[str, Any], files: Any, run_uri: str) -> dict[str, Any] | None:
    """What a registry version of a script run's checkpoint says of how to load it (None: ringflow's own loop):
    the script, the bundle it ran from (its sha256 and where it lies in the run folder), the engine, the state
    file and how to load it."""
    if SCRIPT_META not in meta:
        return None
    state_file = next((name for name in STATE_FILES if name in files), None)
    digest = meta.get(BUNDLE_META)
    return {"script": meta[SCRIPT_META], "bundle_sha256": digest,
            "bundle": f"{run_uri.rstrip('/')}/{bundle_key(digest)}" if digest else None,
            "engine": meta.get("engine"), "state_file": state_file, "load": HOW_TO_LOAD.get(state_file)}
