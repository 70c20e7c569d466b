"""Platform core: versioned models in a store and the production pointer (model_registry). No Airflow."""
