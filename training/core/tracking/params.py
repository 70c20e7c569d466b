"""A job config as MLflow params: nested objects flattened to dotted keys, values as JSON text."""
from __future__ import annotations

import json
from typing import Any, Mapping

# MLflow's limits (mlflow/utils/validation.py): a longer value is refused, so it is cut and says so.
MAX_VALUE_CHARS = 6000
MAX_KEY_CHARS = 250


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"health": {"every_steps": 10}, "epochs": 5} -> {"health.every_steps": "10", "epochs": "5"}.
    Strings stay as they are; everything else is its JSON text (true, null, [64, 64]), so a param reads
    back the same whatever its type. An empty object is kept as "{}": its absence would say nothing."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, f"{name}."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        if len(text) > MAX_VALUE_CHARS:
            marker = f"… ({len(text)} chars)"
            text = text[:MAX_VALUE_CHARS - len(marker)] + marker
        out[name[:MAX_KEY_CHARS]] = text
    return out
