"""Airflow adapters: the operators, the trigger, Airflow connections -> the core's settings (connections) and
the pipeline factory. The logic they call lives in ringflow.training (the engine and the platform core)."""
