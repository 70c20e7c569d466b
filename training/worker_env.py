"""Environment variables the launcher sets for every rank (kept torch-free: the launcher imports it)."""
# Identifies one launch, so the launcher can tell this attempt's result.json from an earlier attempt's.
ATTEMPT_ENV = "RINGFLOW_ATTEMPT_ID"
