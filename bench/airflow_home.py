"""For the benchmarks that import ringflow.operators: Airflow wants a home, and a benchmark should leave none."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def use_throwaway_airflow_home() -> None:
    """Point AIRFLOW_HOME at a temporary folder removed at exit, unless the caller already set one."""
    if "AIRFLOW_HOME" not in os.environ:
        os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="ringflow-bench-airflow-")
        atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], True)
