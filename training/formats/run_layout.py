"""What a run folder (the job config's run_uri) holds. Torch-free, so Airflow code can import it. An attempt
writes its own files (checkpoints, health records, heartbeat, result, replay reports) under attempts/<number>/,
which run.json points to (run_folder.py); the Airflow tasks write theirs at the top.

    checkpoints/ckpt-<step>/...   checkpoint.py: files, then MANIFEST.json
    health.jsonl                  health/records.py: gradient-sync health, one record a line (the newest)
    health/<n>.jsonl              health/records.py: older records, sealed segments of a long run
    heartbeat.json                health/heartbeat.py: rank 0's proof of life, rewritten every few seconds
    result.json                   run_result.py: the attempt's RunResult (status, final checkpoint, verdict)
    eval.json                     evaluate.py: metrics of the final checkpoint on the held-out split
    health.png                    the Airflow train task's plot of health.jsonl
    remedies.jsonl                the train task's remedies for its retries (core/remediation.py's
                                  PlannedRemedy, one a line, oldest first; `remediation: "auto"` only)
    replay/rank-<r>.json          rank/replay_exchange.py: each rank's replay of a non-finite step
    watcher/probe.json            the watcher's own write, made when rank 0's heartbeat is late, to tell a
                                  store slow to take writes from a silent job (runs/store_probe.py)
"""
CHECKPOINTS = "checkpoints"
HEALTH = "health.jsonl"
HEALTH_SEGMENTS = "health/"
HEARTBEAT = "heartbeat.json"
RESULT = "result.json"
EVAL = "eval.json"
HEALTH_PLOT = "health.png"
REMEDIES = "remedies.jsonl"
WATCHER_PROBE = "watcher/probe.json"
REPLAY_REPORTS = "replay/"
