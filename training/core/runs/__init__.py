"""Platform core, a run seen from outside its job: where the pipeline puts things in the store (store_layout),
the watcher's health verdict (health_watch) and the health plot (health_plot). No Airflow, no torch."""
