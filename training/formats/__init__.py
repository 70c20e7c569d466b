"""What every layer reads and writes (config, manifest, checkpoint, run result, eval result); no torch, no Airflow."""
