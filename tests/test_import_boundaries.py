"""The package boundaries the layout promises (training/__init__.py draws the layers):

- rank code (ringflow.training.rank) never imports the core or Airflow: a rank runs on a pod with neither;
- the shared formats, store and health packages import neither the rank nor the core, nor torch;
- nothing under ringflow.training imports Airflow or the Airflow adapters (ringflow.operators);
- the core's launch/run/registry packages and operators/ never import torch or horovod at import time;
- everything installs under the `ringflow` namespace only.

The layer rules are read from the source (every import statement, function-level ones included), so a lazy
import across a boundary is caught too."""
import ast
import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ringflow.operators
import ringflow.training
import ringflow.training.core.backends
import ringflow.training.core.registry
import ringflow.training.core.runs

ROOT = Path(__file__).resolve().parents[1]


def modules(package) -> list[str]:
    return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def imported_after(names: list[str], forbidden: tuple[str, ...]) -> list[str]:
    code = ("import importlib, sys\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({forbidden!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])


TRAINING = ROOT / "training"
SHARED = ("formats", "store", "health")
# layer -> the ringflow.training layers it must never import
FORBIDDEN_LAYERS = {"rank": ("core",), **{shared: ("rank", "core") for shared in SHARED}}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["ringflow", "training"] else None


def imports_of(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            package = ["ringflow", "training", *path.relative_to(TRAINING).parent.parts]
            base = package[: len(package) - (node.level - 1)]
            found.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def layer_violations() -> list[str]:
    bad = []
    for path in sorted(TRAINING.rglob("*.py")):
        layer = layer_of("ringflow.training." + ".".join(path.relative_to(TRAINING).with_suffix("").parts))
        for line, module in imports_of(path):
            target = layer_of(module)
            if target in FORBIDDEN_LAYERS.get(layer, ()) or (layer in SHARED and module.split(".")[0] == "torch"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def test_each_layer_imports_only_what_it_may():
    assert layer_violations() == []


def test_the_layer_rule_sees_a_violation(tmp_path, monkeypatch):
    """The rule can fail: a rank module that imports the core (lazily, inside a function) is named."""
    fake = tmp_path / "training"
    (fake / "rank").mkdir(parents=True)
    (fake / "rank" / "bad.py").write_text("def f():\n    from ringflow.training.core.launcher import run_local\n")
    (fake / "formats").mkdir()
    (fake / "formats" / "worse.py").write_text("from ..rank import bad\nimport torch\n")
    monkeypatch.setattr(sys.modules[__name__], "TRAINING", fake)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert layer_violations() == ["training/formats/worse.py:1 imports ringflow.training.rank",
                                  "training/formats/worse.py:2 imports torch",
                                  "training/rank/bad.py:2 imports ringflow.training.core.launcher"]


def needs_tensorflow(module: str) -> bool:
    """A module that imports TensorFlow at import time: it runs in the TF venv (scripts/setup.sh), never here."""
    path = TRAINING.joinpath(*module.split(".")[2:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return any(name.split(".")[0] == "tensorflow" for _, name in imports_of(path)
               if not _inside_function(path, name))


def _inside_function(path: Path, name: str) -> bool:
    """Whether every import of `name` in `path` is inside a function (a lazy import)."""
    tree = ast.parse(path.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return not any((isinstance(n, ast.Import) and any(a.name == name for a in n.names))
                   or (isinstance(n, ast.ImportFrom) and n.module == name) for n in top)


def airflow_venv_modules() -> list[str]:
    return [m for m in modules(ringflow.training) if not needs_tensorflow(m)]


def test_only_the_tensorflow_rank_modules_need_tensorflow():
    assert [m for m in modules(ringflow.training) if needs_tensorflow(m)] == [
        "ringflow.training.rank.tf_models", "ringflow.training.rank.tf_optimizers"]


@pytest.mark.job
def test_the_tensorflow_rank_never_imports_torch(tf_python):
    """The TF venv has no torch: every module a TensorFlow rank imports is torch-free (run in that venv)."""
    names = ["ringflow.training.rank.tensorflow_worker", "ringflow.training.rank.engines.tensorflow",
             "ringflow.training.rank.tf_models", "ringflow.training.rank.tf_optimizers", "ringflow.training.__main__"]
    code = ("import importlib, sys\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'horovod', 'airflow'}))")
    out = subprocess.run([tf_python, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.job
def test_a_torch_rank_never_imports_pandas_or_the_data_checks():
    """Every job starts a Python per rank: what a rank imports, each rank pays for at every start. Its shards
    are read with pyarrow alone (formats/tensor_columns.py), so pandas and Great Expectations stay out."""
    names = ["ringflow.training.__main__", "ringflow.training.rank.worker"]
    assert imported_after(names, ("pandas", "great_expectations", "airflow")) == []


@pytest.mark.job
def test_training_never_imports_airflow_nor_the_airflow_adapters():
    """Every module of ringflow.training (the torch side's), imported in one fresh interpreter: no Airflow, and
    none of ringflow.operators (the adapters depend on training, never the other way)."""
    code = ("import importlib, sys\n"
            f"for name in {airflow_venv_modules()!r}: importlib.import_module(name)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'airflow'}))\n"
            "print(sorted(m for m in sys.modules if m.startswith('ringflow.operators')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-2:] == ["[]", "[]"]


CORE = (ringflow.training.core.runs, ringflow.training.core.registry, ringflow.training.core.backends)


@pytest.mark.job
@pytest.mark.parametrize("package", CORE, ids=lambda p: p.__name__)
def test_the_core_never_imports_airflow_torch_or_horovod_at_import_time(package):
    """The CLI and the operators both use the core: it must import without either side's heavy stack."""
    assert imported_after(modules(package), ("airflow", "torch", "horovod")) == []


@pytest.mark.job
def test_operators_never_import_torch_or_horovod_at_import_time():
    assert imported_after(modules(ringflow.operators), ("torch", "horovod")) == []


@pytest.mark.job
def test_wheel_installs_only_under_ringflow(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(ROOT), "-w", str(tmp_path)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("ringflow-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"ringflow", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "ringflow/training/rank/worker.py" in names and "ringflow/operators/train.py" in names
    assert "ringflow/training/core/backends/kubernetes/mpijob_backend.py" in names
    assert {"ringflow/training/core/runs/store_layout.py", "ringflow/training/core/registry/model_registry.py",
            "ringflow/training/formats/config.py"} <= set(names)


@pytest.mark.job
def test_mlflow_is_imported_only_when_a_pipeline_is_given_an_mlflow_connection():
    """MLflow is optional: the operators, the tracking package and a DAG built with the pipeline factory (no
    mlflow_conn_id) never import it."""
    import ringflow.training.core.tracking

    names = modules(ringflow.operators) + modules(ringflow.training.core.tracking)
    assert imported_after(names, ("mlflow",)) == []
    code = ("import sys\n"
            "from airflow.sdk import DAG\n"
            "from ringflow.operators.pipeline import ringflow_pipeline\n"
            "from ringflow.operators.pipeline_specs import DataSpec, TrainingSpec\n"
            "with DAG('no_mlflow', schedule=None):\n"
            "    ringflow_pipeline('digits', data=DataSpec('builtin:digits'), model_name='m', store_uri='/tmp/s',\n"
            "                      training=TrainingSpec(epochs=1, batch_size=32, learning_rate=0.01))\n"
            "print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.job
def test_parsing_a_dag_loads_no_data_stack():
    """The scheduler parses DAG files over and over: the pipeline factory must not load pandas, numpy, pyarrow
    or Great Expectations (the validate operator imports the core's engine when its task runs)."""
    assert imported_after(["ringflow.operators.pipeline", "ringflow.operators.sweep"],
                          ("pandas", "numpy", "pyarrow", "great_expectations")) == []


# -- import cycles ------------------------------------------------------------------------------------------

# Where each importable tree's sources lie: package name -> folder (pyproject.toml's package-dir; the example
# DAGs are top-level modules, parsed so that what they import is in the graph too).
SOURCES = {"ringflow.training": TRAINING, "ringflow.operators": ROOT / "operators", "dags": ROOT / "dags"}


def module_files(sources: dict[str, Path]) -> dict[str, Path]:
    """Every module of `sources` by its dotted name (a package by its own name, for its __init__.py)."""
    found = {}
    for package, folder in sources.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            found[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def imported_names(module: str, path: Path) -> list[str]:
    """The absolute dotted name of everything `path` (module `module`) imports, anywhere in it: inside
    functions and `if TYPE_CHECKING:` too (a lazy or hint-only import is still a dependence), relative
    imports resolved against its package. `from a.b import c` gives a.b.c: c may be a module or a name."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module
            names += [base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names]
    return names


def module_of(name: str, modules) -> str | None:
    """The module `name` is or is in (a.b.c: module a.b.c if there is one, else a name in a.b); None: not ours."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def import_graph(sources: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports.

    An import names the one module it resolves to, not the packages above it, though Python runs their
    __init__ first: a package's __init__ that re-exports its modules would otherwise be in a cycle with every
    module of the package that imports a sibling, a cycle Python never trips on (the package is initialised
    before any of its modules). A name imported from a package (`from ..store import open_store`) is an edge
    to that package's __init__, which is what runs it."""
    files = module_files(sources)
    return {module: {found for name in imported_names(module, path)
                     if (found := module_of(name, files)) is not None and found != module}
            for module, path in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of `graph` (each sorted; iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def import_cycles(sources: dict[str, Path]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a loop."""
    return sorted(c for c in strongly_connected(import_graph(sources)) if len(c) > 1)


def test_no_module_imports_itself_round_a_loop():
    cycles = import_cycles(SOURCES)
    assert not cycles, "import cycles (each: modules that import each other round a loop): " + "; ".join(
        " <-> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_sees_a_lazy_cycle(tmp_path):
    """The check can fail: a lazy import inside a function, relative, closes a loop of three modules."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .c import C\n")
    (package / "a.py").write_text("from pkg.b import B\n")
    (package / "b.py").write_text("import pkg.sub.c\nB = 1\n")
    (package / "sub" / "c.py").write_text("def f():\n    from ..a import B\nC = 2\n")
    (package / "d.py").write_text("from pkg.sub import C\nfrom pkg import a\n")
    assert import_cycles({"pkg": package}) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert strongly_connected({"x": {"y"}, "y": set()}) == [["y"], ["x"]]
