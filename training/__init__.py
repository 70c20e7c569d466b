"""ringflow's training side, in three layers and the formats they share (operators/ is the fourth: Airflow).

    ringflow.operators      Airflow adapters: thin operators, the trigger, the pipeline factory, links
         |  calls
    training/core/          the Airflow-free core: launcher and backends (local, MPIJob, TrainJob), validate,
         |                  shard, evaluate, the gate and the registry, run-folder readers, tracking, the
         |  launches        failure policy, the `ringflow` shell commands
    training/rank/          what runs in one rank: worker, loop, callbacks, engines, data, checkpoint writer,
                            the in-job health monitor and watchdog
    training/formats/       what they all read and write: config, manifest, checkpoint, run folder and result,
    training/store/         exit codes, the engine table; object stores (local folder, S3);
    training/health/        health records, heartbeat and the verdict rules

Imports go down the picture and into the shared packages, never up: rank never imports core; formats, store
and health import neither rank nor core nor torch; nothing here imports Airflow
(tests/test_import_boundaries.py keeps these rules). `python -m ringflow.training CONFIG` (__main__.py) is a
rank's entry point.
"""
