"""The Airflow-free core: runs, backends, registry, gate and the decisions on a run (never imports Airflow)."""
