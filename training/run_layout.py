"""What a run folder (the job config's checkpoint.uri) holds. Torch-free, so Airflow code can import it.

    checkpoints/ckpt-<step>/...   checkpoint.py: files, then MANIFEST.json
    health.jsonl                  health/records.py: gradient-sync health, one record a line (the newest)
    health/<n>.jsonl              health/records.py: older records, sealed segments of a long run
    result.json                   worker.py: how the job ended, its final checkpoint and health verdict
    eval.json                     evaluate.py: metrics of the final checkpoint on the held-out split
    health.png                    the Airflow train task's plot of health.jsonl
"""
CHECKPOINTS = "checkpoints"
HEALTH = "health.jsonl"
HEALTH_SEGMENTS = "health/"
RESULT = "result.json"
EVAL = "eval.json"
HEALTH_PLOT = "health.png"
