"""MkDocs hook: the reference pages, generated from the code each time the site is built, so they cannot drift.

Registered under `hooks:` in mkdocs.yml. `on_files` adds, as pages that exist only in the build:

- reference/config.md       every job-config field (training/formats/config.py's frozen dataclasses): its type,
                            default, the check its class's __post_init__ makes and the comment or docstring line
                            that describes it;
- reference/cli.md          `ringflow --help` and each subcommand's (training/core/cli.py's parser);
- reference/exit-codes.md   training/formats/exit_codes.py's codes and meanings;
- reference/failure-policy.md  the failure policy's rows (tests/training/core/test_failure_policy.py's ROWS),
                            each decided by training/core/failure_policy.decide as the page is built;
- reference/environment.md  the environment variables the code names (`*_ENV`/`*_VAR` constants and
                            `RINGFLOW_*` names in training/, operators/, dags/);
- reference/operators.md    the operators' and the pipeline factory's parameters (operators/*.py, read with
                            `ast`, so building the site needs no Airflow);
- benchmarks/results/*.md   bench/results/*.md as they are, so every figure's link to its results file is
                            checked by the strict build; and in docs/benchmarks.md, at its marker, the table of
                            every results file with the command that made it (`on_page_markdown`).

Each page is a function of this module returning Markdown (the tests call `config_page()` directly).
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import html
import importlib.util
import inspect
import json
import os
import pathlib
import re
import sys
import textwrap
import typing
from typing import Any, Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The generated pages, by their path in the site: the function that writes each.
GENERATED = {
    "reference/config.md": "config_page",
    "reference/cli.md": "cli_page",
    "reference/exit-codes.md": "exit_codes_page",
    "reference/failure-policy.md": "failure_policy_page",
    "reference/environment.md": "environment_page",
    "reference/operators.md": "operators_page",
}

NOTE = ("!!! note \"Generated\"\n    This page is generated from `{source}` each time the site is built "
        "(`docs/hooks/reference.py`): it says what the code says.\n")


# ----------------------------------------------------------------------------------------------- helpers

def cell(text: str) -> str:
    """Text for one table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: str) -> str:
    """A code span holding `text` whatever backticks it has, safe in a table cell."""
    text = " ".join(str(text).split())
    ticks = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}".replace("|", "\\|")


def prose(text: str) -> str:
    """Plain text from a docstring or comment as Markdown: `<`, `>`, `&` and `*` escaped outside code spans."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([*_\[\]])", r"\\\1", html.escape(parts[i], quote=False))
    return "".join(parts)


def as_json(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def load_path(name: str, path: pathlib.Path):
    """A module from a file that is not on the import path (the failure policy's test rows)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------ job config

def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment: the `#` lines right above it in the class body, or its trailing `# ...`."""
    lines = inspect.getsource(cls).splitlines()
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.match(r"\s+(\w+): [^#]*?(?:#\s*(.*))?$", line)
        if not m or m.group(1) not in names:
            continue
        above = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            above.insert(0, lines[j].strip().lstrip("#").strip())
            j -= 1
        text = " ".join(above + ([m.group(2)] if m.group(2) else []))
        if text:
            out[m.group(1)] = text
    return out


def _docstring_fields(cls: type) -> dict[str, str]:
    """`name: text` paragraphs of the class docstring (continuation lines indented), by field name."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    current = None
    for line in doc.splitlines():
        m = re.match(r"(\w+): (.*)", line)
        if m and m.group(1) in names:
            current = m.group(1)
            out[current] = m.group(2)
        elif current and line.startswith(" ") and line.strip():
            out[current] += " " + line.strip()
        else:
            current = None
    return out


def _probe(cls: type) -> Any:
    """An instance of `cls` at its defaults (required fields given a valid value), for the checks' f-strings."""
    required = {"manifest_uri": "shards/manifest.json", "run_uri": "run", "period": 1, "kind": "crash",
                "script": "train.py", "file": "part-00000.parquet", "row": 0}
    kwargs = {f.name: required[f.name] for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    try:
        return cls(**kwargs)
    except Exception:  # noqa: BLE001 - the page then shows the f-string's source for what it cannot fill
        return None


def _text(node: ast.AST, namespace: dict[str, Any]) -> str:
    """A message argument as the reader sees it: evaluated where it can be (module constants, the field's
    defaults), with `…` for what only a bad value fills in."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            else:
                try:
                    value = eval(compile(ast.Expression(part.value), "<check>", "eval"), dict(namespace))
                    spec = _text(part.format_spec, namespace) if part.format_spec else ""
                    out.append(format(value, spec))
                except Exception:  # noqa: BLE001
                    out.append("…")
        return "".join(out)
    try:
        return str(eval(compile(ast.Expression(node), "<check>", "eval"), dict(namespace)))
    except Exception:  # noqa: BLE001
        return ast.unparse(node)


def _loop_values(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> dict[str, list[Any]]:
    """The names bound by the `for name in (<constants>)` loops around `node`."""
    out: dict[str, list[Any]] = {}
    p = parents.get(node)
    while p is not None:
        if isinstance(p, ast.For) and isinstance(p.target, ast.Name):
            with contextlib.suppress(ValueError):
                out[p.target.id] = list(ast.literal_eval(p.iter))
        p = parents.get(p)
    return out


def _checks(func: Any, namespace: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field path, what the check asks for) for every check `func` makes: `_require(cond, FIELD, problem, FIX)`,
    `_positive_int(obj, name, FIELD, minimum=1)` and `_positive_number(obj, name, FIELD, allow_zero=False)`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        name, args = node.func.id, node.args
        kw = {k.arg: k.value for k in node.keywords}
        if name == "_require" and len(args) >= 4:
            field, fix = args[1], _text(args[3], namespace)
        elif name == "_positive_int" and len(args) >= 3:
            minimum = ast.literal_eval(kw.get("minimum", args[3] if len(args) > 3 else ast.Constant(1)))
            field, fix = args[2], f"a whole number >= {minimum}"
        elif name == "_positive_number" and len(args) >= 3:
            allow_zero = ast.literal_eval(kw.get("allow_zero", args[3] if len(args) > 3 else ast.Constant(False)))
            field, fix = args[2], f"a number {'>=' if allow_zero else '>'} 0"
        else:
            continue
        if isinstance(field, ast.Constant):
            yield str(field.value), fix
        elif isinstance(field, ast.JoinedStr):
            loops = _loop_values(node, parents)
            for var, values in loops.items():
                for value in values:
                    yield _text(field, namespace | {var: value}), fix


def config_sections() -> list[tuple[str, type, str]]:
    """(section title, class, field path prefix) for every object of the job config, the document first."""
    from ringflow.training.formats import config as C

    sections = [("The document", C.JobConfig, "")]
    seen = {C.JobConfig}
    for (owner, name), nested in C._NESTED.items():
        owner_prefix = next(p for _, c, p in sections if c is owner)
        sections.append((f"`{owner_prefix}{name}`", nested, f"{owner_prefix}{name}."))
        seen.add(nested)
    sections.append(("`faults[]`", C.FaultConfig, "faults[]."))
    sections.append(("`skip_rows[]`", C.RowRef, "skip_rows[]."))
    return sections


def _type(cls: type, f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _default(cls: type, f: dataclasses.Field, nested: set[type]) -> str:
    if f.default is not dataclasses.MISSING:
        return code(as_json(f.default))
    if f.default_factory is not dataclasses.MISSING:
        made = f.default_factory()
        if type(made) in nested:
            return "the section's defaults"
        return code(as_json(made))
    return "**required**"


def config_page() -> str:
    from ringflow.training.formats import config as C

    sections = config_sections()
    nested = {c for _, c, _ in sections}
    checks: dict[str, list[str]] = {}
    for _, cls, _ in sections:
        namespace = vars(C) | {"self": _probe(cls)}
        for path, fix in _checks(cls.__post_init__, namespace):
            checks.setdefault(path, [])
            if fix not in checks[path]:
                checks[path].append(fix)
    engine_checks = list(_checks(C.check_engine_fits, vars(C) | {"cfg": _probe(C.JobConfig)}))

    out = ["# Job config reference", "", NOTE.format(source="training/formats/config.py"),
           "One JSON document (`ringflow train CONFIG`, the train task's config): every field below is checked "
           "before any process starts, and a bad value fails with the field and the fix "
           "(`config field 'batch_size': is -4; use a whole number >= 1`). An unknown field is refused by name. "
           "The prose guide is [Job config](../guides/job-config.md).", ""]
    for title, cls, prefix in sections:
        out += [f"## {title}", ""]
        if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
            out += [prose(inspect.cleandoc(cls.__doc__).split("\n\n")[0]), ""]
        out += [f"`{cls.__module__.replace('ringflow.', '')}.{cls.__name__}`", "",
                "| field | type | default | check: a bad value's fix | what it is |", "|---|---|---|---|---|"]
        comments = _field_comments(cls) | _docstring_fields(cls)
        for f in dataclasses.fields(cls):
            path = prefix + f.name
            says = checks.get(path, [])
            if type(f.default_factory()) in nested if f.default_factory is not dataclasses.MISSING else False:
                says = says or ["an object (its fields below)"]
            sub = next((t for t, c, p in sections if p == path + "."), None)
            what = prose(comments.get(f.name, ""))
            if sub:
                what = (what + " " if what else "") + f"Its fields: [{sub.strip('`')}](#{_anchor(sub)})."
            out.append(f"| {code(path)} | {code(_type(cls, f))} | {_default(cls, f, nested)} | "
                       f"{cell('; '.join(prose(s) for s in says)) or '—'} | {cell(what) or '—'} |")
        out.append("")
    out += ["## Checks across fields", "",
            "The engine is checked against the rest of the config (`formats/config.check_engine_fits`), for the "
            "config's own `engine` and for `ringflow train --engine`/`$RINGFLOW_ENGINE` alike:", "",
            "| field | fix |", "|---|---|"]
    out += [f"| {code(path)} | {cell(prose(fix))} |" for path, fix in engine_checks]
    return "\n".join(out) + "\n"


def _anchor(title: str) -> str:
    from markdown.extensions.toc import slugify

    return slugify(title.strip("`"), "-")


# -------------------------------------------------------------------------------------------------- CLI

@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def cli_page() -> str:
    from ringflow.training.core import cli

    with _columns(100):
        top = cli.parser()
        subs = next(a for a in top._actions if a.__class__.__name__ == "_SubParsersAction")
        out = ["# `ringflow` command reference", "", NOTE.format(source="training/core/cli.py"),
               "Each command's `--help`, as its parser prints it. What the commands print and how they answer "
               "bad input: [The shell](../guides/shell.md). Exit statuses: [Exit codes](exit-codes.md).", "",
               "```text", top.format_help().rstrip(), "```", ""]
        for name, sub in subs.choices.items():
            out += [f"## `ringflow {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------- exit codes

def exit_codes_page() -> str:
    from ringflow.training.formats import exit_codes as X

    names = {X.OK: "OK", X.ERROR: "ERROR", X.CONFIG: "CONFIG", X.KILLED: "KILLED", X.TERMINATED: "TERMINATED"}
    names |= {code_: f"BY_VERDICT[{verdict}]" for verdict, code_ in X.BY_VERDICT.items()}
    out = ["# Exit codes", "", NOTE.format(source="training/formats/exit_codes.py"),
           prose(inspect.cleandoc(X.__doc__)), "",
           "| code | name | meaning |", "|---|---|---|"]
    for code_ in sorted(X.MEANING):
        out.append(f"| {code_} | {code(names.get(code_, ''))} | {cell(X.meaning(code_))} |")
    out += ["", "Any other status is reported as `exit code N`. The other `ringflow` commands exit 2 on bad input "
            "(one line on stderr naming the problem and the fix) and 1 when the step ran and said no (data the "
            "suite refuses, a promotion the gate refuses): [The shell](../guides/shell.md).", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ failure policy

def failure_policy_page() -> str:
    from ringflow.training.core import failure_policy as P

    rows = load_path("ringflow_docs_failure_policy_rows",
                     ROOT / "tests" / "training" / "core" / "test_failure_policy.py")
    out = ["# Failure policy table", "", NOTE.format(source="training/core/failure_policy.py"),
           "One row per case of `tests/training/core/test_failure_policy.py` (`ROWS`), each decided here by "
           "`failure_policy.decide` as the page is built: what becomes of an attempt given what is known of it. "
           f"Verdicts never retried as they are: {', '.join(code(v) for v in P.NOT_RETRYABLE)} "
           "(with `remediation: \"auto\"` a remedy can still turn them into a retry: "
           "[the fault table](../guides/fault-table.md)). The prose: "
           "[Reliability](../guides/reliability.md#failure-policy).", "",
           "| case | decision | stop the job | exit status | reason given |", "|---|---|---|---|---|"]
    for name, (seen, *_expected) in rows.ROWS.items():
        d = P.decide(seen)
        exit_ = "—" if d.exit_code is None else str(d.exit_code)
        out.append(f"| {cell(prose(name))} | {d.action.value} | {'yes' if d.stop_job else 'no'} | {exit_} | "
                   f"{cell(prose(d.reason)) or '—'} |")
    remedied = getattr(rows, "REMEDIATED", {})
    if remedied:
        out += ["", "## With a remedy", "",
                "`failure_policy.remediated(decision, remedy)`: what the remediation policy's answer does to a "
                "decision (`tests/training/core/test_failure_policy.py`, `REMEDIATED`).", "",
                "| case | decision | reason given |", "|---|---|---|"]
        for name, row in remedied.items():
            decision, remedy = row[0], row[1]
            d = P.remediated(decision, remedy)
            out.append(f"| {cell(prose(name))} | {d.action.value} | {cell(prose(d.reason)) or '—'} |")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ environment

ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _python_files() -> Iterator[pathlib.Path]:
    for folder in ("training", "operators", "dags"):
        yield from sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def environment_page() -> str:
    defined: dict[str, list[tuple[str, str, str]]] = {}  # variable -> [(module, constant, comment)]
    used: dict[str, set[str]] = {}
    for path in _python_files():
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                pairs = []
                if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
                    pairs = [(target.id, node.value.value)]
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = [(t.id, v.value) for t, v in zip(target.elts, node.value.elts)
                             if isinstance(t, ast.Name) and isinstance(v, ast.Constant)]
                for const, value in pairs:
                    if re.search(r"_(ENV|VAR)$", const) and isinstance(value, str) and ENV_NAME.match(value):
                        above, j = [], node.lineno - 2
                        while j >= 0 and lines[j].strip().startswith("#"):
                            above.insert(0, lines[j].strip().lstrip("#").strip())
                            j -= 1
                        trailing = re.search(r"#\s*(.*)$", lines[node.lineno - 1])
                        comment = " ".join(above + ([trailing.group(1)] if trailing else []))
                        defined.setdefault(value, []).append((rel, const, comment))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"RINGFLOW_[A-Z0-9_]+", node.value):
                used.setdefault(node.value, set()).add(rel)
    out = ["# Environment variables", "", NOTE.format(source="training/, operators/, dags/"),
           "Every variable the code names: a module-level constant whose name ends in `_ENV` or `_VAR` (where it "
           "is defined, and the comment above it), and every `RINGFLOW_*` name written out in the code (where). "
           "What to set where, with defaults: [Configuration](../guides/configuration.md).", "",
           "## Defined as constants", "", "| variable | constant | comment |", "|---|---|---|"]
    for var in sorted(defined):
        for rel, const, comment in defined[var]:
            out.append(f"| {code(var)} | {code(rel + ': ' + const)} | {cell(prose(comment)) or '—'} |")
    out += ["", "## `RINGFLOW_*` names in the code", "", "| variable | named in |", "|---|---|"]
    for var in sorted(used):
        out.append(f"| {code(var)} | {', '.join(code(m) for m in sorted(used[var]))} |")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- operators

def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, str, str]]:
    """(name, annotation, default) of each parameter but self/cls."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = []
    for arg, default in list(zip(positional, defaults)) + list(zip(a.kwonlyargs, a.kw_defaults)):
        if arg.arg in ("self", "cls"):
            continue
        out.append((arg.arg, ast.unparse(arg.annotation) if arg.annotation else "",
                    "**required**" if default is None else code(ast.unparse(default))))
    if a.vararg:
        out.append(("*" + a.vararg.arg, ast.unparse(a.vararg.annotation) if a.vararg.annotation else "", ""))
    if a.kwarg:
        out.append(("**" + a.kwarg.arg, ast.unparse(a.kwarg.annotation) if a.kwarg.annotation else "",
                    "BaseOperator's (task_id, retries, …)" if a.kwarg.arg == "kwargs" else ""))
    return out


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    out = ["| parameter | type | default |", "|---|---|---|"]
    out += [f"| {code(n)} | {code(t) if t else '—'} | {d or '—'} |" for n, t, d in rows]
    return out


def _doc(node: ast.AST) -> list[str]:
    doc = ast.get_docstring(node)
    return [prose(doc), ""] if doc else []


def operators_page() -> str:
    out = ["# Operators and the pipeline factory", "", NOTE.format(source="operators/*.py"),
           "Every operator and trigger of `ringflow.operators`, the pipeline factory and its typed specs: "
           "their parameters as the code declares them, and their docstrings. How they fit together: "
           "[Airflow pipelines](../guides/pipelines.md).", ""]
    factories, specs, classes = [], [], []
    for path in sorted((ROOT / "operators").glob("*.py")):
        module = "ringflow.operators." + path.stem
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and (node.name.startswith("ringflow_")
                                                      or node.name == "pipeline_tasks"):
                factories.append((module, node))
            elif isinstance(node, ast.ClassDef):
                is_dataclass = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
                if is_dataclass and node.name.endswith("Spec"):
                    specs.append((module, node))
                elif node.name.endswith(("Operator", "Trigger")) and not node.name.startswith("_"):
                    classes.append((module, node))
    out += ["## The pipeline factory", ""]
    for module, fn in factories:
        out += [f"### `{fn.name}`", "", f"`{module}.{fn.name}`", "", *_doc(fn), *_table(_params(fn)), ""]
    out += ["## The specs", "", "Frozen dataclasses checked when the DAG file is parsed.", ""]
    for module, cls in specs:
        rows = []
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                rows.append((stmt.target.id, ast.unparse(stmt.annotation),
                             "**required**" if stmt.value is None else code(ast.unparse(stmt.value))))
        out += [f"### `{cls.name}`", "", f"`{module}.{cls.name}`", "", *_doc(cls), *_table(rows), ""]
    out += ["## Operators and triggers", ""]
    for module, cls in classes:
        init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        bases = ", ".join(ast.unparse(b) for b in cls.bases)
        out += [f"### `{cls.name}`", "", f"`{module}.{cls.name}({bases})`", "", *_doc(cls)]
        if init is not None:
            out += [*_doc(init), *_table(_params(init))]
        else:
            out += ["Takes its bases' parameters."]
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ benchmarks

RESULTS_MARKER = "<!-- generated: results files -->"
COMMAND = re.compile(r"\.venv/bin/python -m bench\.[^`\n]*")


def results_table() -> str:
    """Every bench/results/*.md with the command that made it, as the file itself records it (else the module
    that writes it), for docs/benchmarks.md."""
    out = ["| results file | made by |", "|---|---|"]
    for result in sorted((ROOT / "bench" / "results").glob("*.md")):
        found = COMMAND.search(result.read_text())
        module = result.stem.split("-")[0]
        if found:
            made = code(found.group().strip())
        elif (ROOT / "bench" / f"{module}.py").exists():
            made = code(f".venv/bin/python -m bench.{module}") + " (the file does not record its arguments)"
        else:
            made = "—"
        data = result.with_suffix(".json")
        extra = f" and `{data.name}`" if data.exists() else ""
        out.append(f"| [{result.name}](benchmarks/results/{result.name}){extra} | {made} |")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- the hook

def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "benchmarks.md":
        if RESULTS_MARKER not in markdown:
            raise ValueError(f"docs/benchmarks.md lost its marker {RESULTS_MARKER!r}: the results table goes there")
        return markdown.replace(RESULTS_MARKER, results_table())
    return markdown


def on_files(files, config):
    from mkdocs.structure.files import File

    module = sys.modules[__name__]
    for src_uri, name in GENERATED.items():
        files.append(File.generated(config, src_uri, content=getattr(module, name)()))
    for result in sorted((ROOT / "bench" / "results").glob("*.md")):
        files.append(File.generated(config, f"benchmarks/results/{result.name}", abs_src_path=str(result)))
    return files
