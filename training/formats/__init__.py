"""What every layer reads and writes (config, manifests, results, the engine table): no torch, no Airflow."""
