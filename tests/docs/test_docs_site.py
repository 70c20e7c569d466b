"""The documentation site (mkdocs.yml, docs/): it builds in strict mode (a broken link or anchor, a page left out
of the navigation, a missing snippet file fails), its generated reference says what the code says, and the README
stays short and true to the files it shows.

In-process, as `make docs` builds it: no subprocess, so these are pure tests (a few seconds in all)."""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference():
    """docs/hooks/reference.py, the hook that generates the reference pages."""
    spec = importlib.util.spec_from_file_location("ringflow_docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(config_file: pathlib.Path, site_dir: pathlib.Path) -> list[str]:
    """`mkdocs build --strict` of `config_file` into `site_dir`; the warnings it logged (strict: each fails it)."""
    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    handler = Collect()
    logger = logging.getLogger("mkdocs")
    logger.addHandler(handler)
    try:
        config = load_config(str(config_file), strict=True, site_dir=str(site_dir))
        try:
            mkdocs_build(config)
        except Abort as exc:
            warnings.append(f"aborted: {exc}")
    finally:
        logger.removeHandler(handler)
    return warnings


def test_the_site_builds_strictly(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    warnings = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert warnings == [], "\n".join(warnings)
    site = tmp_path / "site"
    for page in ("reference/config", "reference/cli", "reference/exit-codes", "reference/failure-policy",
                 "reference/environment", "reference/operators", "guides/kubernetes", "benchmarks"):
        assert (site / page / "index.html").is_file(), page
    # The example DAGs are the real files, included as the site is built (never a copy that can drift).
    pipelines = (site / "guides" / "pipelines" / "index.html").read_text()
    assert "ringflow_two_models" in pipelines and "--8&lt;--" not in pipelines and "--8<--" not in pipelines


def test_a_broken_anchor_fails_the_strict_build(tmp_path, monkeypatch):
    """What the site test relies on: strict mode refuses a link to a heading that is not there."""
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the other page](other.md#no-such-heading).\n")
    (docs / "other.md").write_text("# Other\n\n## A heading\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: t\nstrict: true\nvalidation:\n  anchors: warn\n")
    warnings = build(config, tmp_path / "site")
    assert any("no-such-heading" in w for w in warnings), warnings


def config_classes():
    from ringflow.training.formats import config as C

    return [obj for obj in vars(C).values()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == C.__name__]


def test_the_config_reference_lists_every_field_of_every_config_dataclass(reference):
    page = reference.config_page()
    sections = {cls: prefix for _, cls, prefix in reference.config_sections()}
    classes = config_classes()
    assert set(classes) == set(sections), "a config dataclass the reference does not reach: " \
                                          f"{sorted(c.__name__ for c in set(classes) - set(sections))}"
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| ([^|]+) \|", page, re.M)
    listed = {path: (typ, default.strip()) for path, typ, default in rows}
    for cls, prefix in sections.items():
        for f in dataclasses.fields(cls):
            path = prefix + f.name
            assert path in listed, f"{cls.__name__}.{f.name} is not in the generated config reference"
            assert listed[path][0].replace("\\|", "|") == f.type, (path, listed[path][0], f.type)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                assert listed[path][1] == "**required**", path


def test_the_config_reference_states_each_fields_check(reference):
    """Every field a __post_init__ checks shows the fix its error gives (here: a few known ones)."""
    page = reference.config_page()
    assert "| `batch_size` | `int` | `32` | a whole number &gt;= 1 |" in page
    assert "`health.max_sync_share`" in page and "use a fraction in (0, 1\\]" in page
    assert "| `optimizer` | `str` | `\"adam\"` | use one of ('sgd', 'adam') |" in page


def test_the_cli_reference_has_every_subcommand(reference):
    from ringflow.training.core import cli

    page = reference.cli_page()
    subs = next(a for a in cli.parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name in subs.choices:
        assert f"## `ringflow {name}`" in page and f"usage: ringflow {name}" in page


def test_the_readme_is_short_and_its_script_is_the_real_file():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    script = (ROOT / "dags" / "scripts" / "ddp_digits" / "train.py").read_text()
    assert script in blocks, "README's training script must be dags/scripts/ddp_digits/train.py as it is"
    # Every relative link of the README (into docs/) names a file that exists; the docs table's targets too.
    for target in re.findall(r"\]\((?!https?:)([^)#\s]+)", readme):
        assert (ROOT / target).exists() or target.startswith("docs/reference/"), target


def test_the_readmes_dag_parses_into_the_pipeline():
    """The README's smallest DAG is real code: it builds the five steps when its file is parsed."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Your own DAG.*?```python\n(.*?)```", readme, re.S).group(1)
    block = re.sub(r"^with (DAG\(.*\)):$", r"with \1 as dag:", block, flags=re.M)
    namespace: dict = {}
    exec(compile(block, "README.md (Your own DAG)", "exec"), namespace)
    steps = {task_id.split(".")[-1] for task_id in namespace["dag"].task_ids}
    assert {"validate", "shard", "train", "evaluate", "promote"} <= steps, steps


def test_every_benchmark_results_file_is_on_the_benchmarks_page(reference):
    """docs/benchmarks.md's generated table lists each bench/results file (linked: strict mode checks it)."""
    table = reference.results_table()
    for result in (ROOT / "bench" / "results").glob("*.md"):
        assert f"(benchmarks/results/{result.name})" in table
    assert reference.RESULTS_MARKER in (ROOT / "docs" / "benchmarks.md").read_text()
