"""What runs inside one training rank: the worker, the loop and its callbacks, the engines (Horovod, DDP,
TensorFlow), the data reader, devices and cores, the model, the training state and the checkpoint writer, the
in-job health monitor and watchdog.

May import: torch, the engines' libraries, ringflow.training.formats, .store, .health.
Never: ringflow.training.core, Airflow, ringflow.operators (a rank runs on a pod with none of them).
"""
