"""The Airflow-free core: runs, backends, registry, gate, validation; never imports Airflow."""
