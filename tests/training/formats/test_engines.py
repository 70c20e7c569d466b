"""The engine table: each engine's launchers, where it can run, its config section and its rank module; a
backend that cannot run an engine is refused with what to do instead."""
import dataclasses
import importlib

import pytest

from ringflow.training.formats.config import JobConfig
from ringflow.training.formats.engines import (CONTROLLERS, DEFAULT_CONTROLLER, DEFAULT_ENGINE, ENGINES, LOCAL,
                                               MPIJOB, TABLE, TRAINJOB, EngineError, check_backend, engine_spec)


@pytest.mark.parametrize("name, launcher, pod_launcher, backends, runtime, section", [
    ("horovod", "horovodrun", "mpirun", (LOCAL, MPIJOB, TRAINJOB), "ringflow-horovod", "horovod"),
    ("ddp", "torchrun", "torchrun", (LOCAL, TRAINJOB), "ringflow-torch", "ddp"),
    ("tensorflow", "tf_config", "tf_config", (LOCAL, TRAINJOB), "ringflow-tensorflow", "tensorflow"),
])
def test_the_table(name, launcher, pod_launcher, backends, runtime, section):
    spec = engine_spec(name)
    assert (spec.launcher, spec.pod_launcher, spec.backends, spec.trainjob_runtime, spec.config_section) == (
        launcher, pod_launcher, backends, runtime, section)


@pytest.mark.parametrize("name", list(TABLE))
def test_every_entry_has_its_config_section_and_rank_module(name):
    spec = TABLE[name]
    assert spec.config_section in {f.name for f in dataclasses.fields(JobConfig)}, spec.name
    module, _ = spec.rank_engine.split(":")
    assert importlib.util.find_spec(module) is not None, spec.rank_engine  # found without importing torch


def test_the_table_names_the_default_and_the_controllers():
    assert ENGINES == tuple(TABLE) and DEFAULT_ENGINE in ENGINES
    assert CONTROLLERS == ("gloo", "mpi") and DEFAULT_CONTROLLER == "mpi"


@pytest.mark.parametrize("engine, backend, refused", [
    ("horovod", LOCAL, None), ("horovod", MPIJOB, None), ("horovod", TRAINJOB, None),
    ("ddp", LOCAL, None), ("ddp", TRAINJOB, None),
    ("tensorflow", LOCAL, None), ("tensorflow", TRAINJOB, None),
    ("ddp", MPIJOB, r"engine 'ddp' cannot run as an MPIJob .*mpirun.*TrainJob.*LocalProcessBackend.*\"horovod\""),
    ("tensorflow", MPIJOB, r"engine 'tensorflow' cannot run as an MPIJob \(it launches 'horovod' engine ranks with "
                           r"mpirun\)\. Run the tensorflow engine as a Kubeflow TrainJob .*, or locally "
                           r"\(backend=LocalProcessBackend\(\)\), or set engine to \"horovod\"$"),
    ("jax", LOCAL, r"'engine' is 'jax'; use one of \('horovod', 'ddp', 'tensorflow'\)"),
])
def test_check_backend(engine, backend, refused):
    if refused is None:
        assert check_backend(engine, backend) is TABLE[engine]
        return
    with pytest.raises(EngineError, match=refused):
        check_backend(engine, backend)


def test_the_trainjob_runtime_comes_from_the_table_unless_the_settings_name_one():
    from ringflow.training.core.backends.kubernetes.settings import TrainJobSettings

    settings = TrainJobSettings(image="registry/ringflow-training:0.1.0")
    assert {e: settings.runtime(e) for e in ENGINES} == {"horovod": "ringflow-horovod", "ddp": "ringflow-torch",
                                                         "tensorflow": "ringflow-tensorflow"}
    mine = dataclasses.replace(settings, ddp_runtime="team-torch")
    assert mine.runtime("ddp") == "team-torch"


@pytest.mark.parametrize("elastic, backend_kind, refused", [
    (False, "local", False), (False, "mpijob", False), (False, "trainjob", False),
    (True, "local", False), (True, "mpijob", False), (True, "trainjob", True),
])
def test_recovery_inside_the_job_runs_where_ringflow_starts_horovods_elastic_driver(elastic, backend_kind, refused):
    from ringflow.training.formats.engines import check_elastic_backend

    if not refused:
        check_elastic_backend(elastic, backend_kind)
        return
    with pytest.raises(EngineError, match="remove elastic .* or run locally .* or as a Kubeflow MPIJob"):
        check_elastic_backend(elastic, backend_kind)
