"""The run page's HTML: one run folder's RunOverview (core/runs/run_overview.py) as a server-rendered page, shown in
the Airflow UI's task-instance tab and opened by the train task's "Run page" link (operators/plugin.py serves it).

Every value that came from the run folder, the registry or the URL is escaped (`_e`): a verdict's reason, a model
name or an evidence key is data, never markup. The health plot is inlined as a data: URI, so the page needs no
second request through the store (an s3:// store has no local file to link). No scripts: the page is static, the
UI's iframe reloads it.
"""
from __future__ import annotations

import base64
import datetime
import html
import json
import math
from typing import Any, Iterable, Mapping

from ringflow.training.core.runs.run_overview import MembershipRow, RunOverview
from ringflow.training.health.verdict import DEGRADED, HEALTHY

STYLE = """
body{font-family:system-ui,sans-serif;margin:1rem;color:#1a202c;max-width:1200px}
h1{font-size:1.3rem;margin:0 0 .5rem}h2{font-size:1.05rem;margin:1.2rem 0 .4rem}
table{border-collapse:collapse;margin:.3rem 0}td,th{border:1px solid #cbd5e0;padding:.2rem .5rem;text-align:left;
vertical-align:top}th{background:#edf2f7}pre{margin:0;white-space:pre-wrap;font-size:.85rem}
.verdict{display:inline-block;padding:.2rem .6rem;border-radius:.3rem;font-weight:bold;color:#fff}
.HEALTHY{background:#2f855a}.DEGRADED{background:#b7791f}.fatal{background:#c53030}.none{background:#718096}
.problem{color:#c53030}.muted{color:#718096}img{max-width:100%;border:1px solid #cbd5e0}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else repr(value)
    return str(value)


def _value_cell(value: Any) -> str:
    """A plain value as text, a nested one as indented JSON, both escaped."""
    if isinstance(value, (Mapping, list, tuple)):
        return f"<pre>{_e(json.dumps(value, indent=1, default=str, sort_keys=True))}</pre>"
    return _e(_number(value))


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], test_id: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table data-testid="{test_id}"><tr>{head}</tr>{body}</table>'


def _size(n: int | None) -> str:
    if n is None:
        return "unreadable"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _verdict(o: RunOverview) -> str:
    v = o.verdict
    if v is None:
        if o.result is not None:
            state = f"the attempt {o.result.status} without a verdict"
        elif o.heartbeat is not None:
            step = o.heartbeat.step if o.heartbeat.step is not None else "none yet"
            state = f"no result yet: training is {o.heartbeat.state} (step {step}, phase {o.heartbeat.phase or '?'})"
        else:
            state = "no result yet: the attempt has written neither a result nor a heartbeat"
        return (f'<h2>Verdict</h2><p><span class="verdict none" data-testid="verdict">NONE</span> '
                f'<span data-testid="reason">{_e(state)}</span></p>')
    css = v.status if v.status in (HEALTHY, DEGRADED) else "fatal"
    text = (f'<h2>Verdict</h2><p><span class="verdict {css}" data-testid="verdict">{_e(v.status)}</span> '
            f'<span data-testid="reason">{_e(v.reason)}</span></p>')
    r = o.result
    text += (f"<p>{_e(r.status)} at step {r.step}, epoch {r.epoch}, on {r.world_size} worker(s), loss "
             f"{_e(_number(r.loss))}; attempt {_e(r.attempt)}"
             + (f"; resumed from {_e(r.resumed_from)}" if r.resumed_from else "")
             + (f"; final checkpoint {_e(r.checkpoint)}" if r.checkpoint else "") + "</p>")
    return text


def _evidence(o: RunOverview) -> str:
    v = o.verdict
    if v is None or not v.evidence:
        return ""
    rows = [(_e(k), _value_cell(val)) for k, val in sorted(v.evidence.items()) if k != "replay"]
    text = "<h2>Evidence</h2>" + _table(("what", "value"), rows, "evidence")
    if o.replay is not None:
        rows = [(_e(k), _value_cell(val)) for k, val in sorted(o.replay.items())]
        text += "<h2>Replay of the non-finite step</h2>" + _table(("what", "value"), rows, "replay")
    return text


def _plot(plot_png: bytes | None) -> str:
    if plot_png is None:
        return '<h2>Health plot</h2><p class="muted">not saved yet: the train task saves it when training ends</p>'
    data = base64.b64encode(plot_png).decode()
    return f'<h2>Health plot</h2><img data-testid="health-plot" alt="health plot" src="data:image/png;base64,{data}">'


def _records_table(title: str, records: tuple[Mapping[str, Any], ...], test_id: str) -> str:
    if not records:
        return ""
    keys = sorted({k for r in records for k in r})
    rows = [[_value_cell(r.get(k, "")) for k in keys] for r in records]
    return f"<h2>{_e(title)}</h2>" + _table(keys, rows, test_id)


def _when(unix: float | None) -> str:
    """A unix time in UTC; "?" for none, or one no date has (a broken record must not break the page)."""
    try:
        return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _membership_row(m: MembershipRow) -> list[str]:
    def known(value, text=None):
        return _e(text if text is not None else value) if value is not None else '<span class="muted">?</span>'

    went = known(m.commit_step) if m.commit_step is not None else '<span class="muted">the run folder\'s</span>'
    rank0 = {True: "yes", False: "no", None: None}[m.rank0_changed]
    return [_e(_when(m.failed_at)), f"{known(m.from_world_size)} → {known(m.to_world_size)}", known(m.why),
            known(m.who), known(m.detail), went, known(m.steps_redone),
            known(m.recovery_seconds, f"{m.recovery_seconds:.2f}" if m.recovery_seconds is not None else None),
            known(rank0), known(m.attempt)]


def _membership(o: RunOverview) -> str:
    """An elastic job's changes of workers inside its attempts (rank/elastic.py): what each cost."""
    if not o.membership_changes:
        return ""
    headers = ("when", "workers", "why", "who", "detail", "went back to the commit of step", "steps redone",
               "recovery (s)", "rank 0 changed", "attempt")
    return ("<h2>Membership changes</h2>"
            + _table(headers, [_membership_row(m) for m in o.membership_changes], "membership-changes")
            + '<p class="muted">recovery: from the change seen to the end of the next round\'s first step</p>')


def _checkpoints(o: RunOverview) -> str:
    if not o.checkpoints:
        return '<h2>Checkpoints</h2><p class="muted">none published</p>'
    rows = [(_e(c.name), _e(c.step if c.step is not None else "?"), _e(_size(c.bytes)), _e(c.attempt or "-"))
            for c in o.checkpoints]
    more = f'<p class="muted">and {o.more_checkpoints} older</p>' if o.more_checkpoints else ""
    return "<h2>Checkpoints</h2>" + _table(("checkpoint", "step", "size", "attempt"), rows, "checkpoints") + more


def _metrics(o: RunOverview) -> str:
    ev = o.evaluation
    if ev is None:
        return '<h2>Evaluation</h2><p class="muted">not evaluated yet (the evaluate task writes eval.json)</p>'
    text = (f"<h2>Evaluation</h2><p>{_e(ev.checkpoint)} (step {ev.step}) on {ev.rows} held-out rows, {_e(ev.task)}, "
            f"{_e(ev.evaluated_at)}</p>")
    headers = ["metric", "this run"] + [f"{p.model} v{p.pointer.version}" + (" (this run)" if p.from_run(o.uri) else "")
                                        for p in o.production]
    rows = []
    for name, value in sorted(ev.metrics.items()):
        cells = [_e(name), _e(_number(value))]
        for p in o.production:
            theirs = p.pointer.metrics.get(name)
            cells.append(_e(_number(theirs)) if isinstance(theirs, (int, float)) else '<span class="muted">-</span>')
        rows.append(cells)
    text += _table(headers, rows, "metrics")
    if not o.production:
        text += '<p class="muted">no model in production has these metrics</p>'
    return text


def _attempts(o: RunOverview) -> str:
    if not o.attempts:
        return ""
    rows = [(_e(n), _e(i or "-")) for n, i in o.attempts]
    return "<h2>Attempts</h2>" + _table(("number", "attempt id"), rows, "attempts")


def render(o: RunOverview, *, title: str, plot_png: bytes | None, folder_link: str | None) -> str:
    """The whole page for one run."""
    problems = "".join(f'<p class="problem">{_e(p)}</p>' for p in o.problems)
    folder = f' (<a href="{_e(folder_link)}">files</a>)' if folder_link else ""
    body = (f"<h1>{_e(title)}</h1><p class=\"muted\">run folder {_e(o.uri)}{folder}</p>{problems}"
            + _verdict(o) + _evidence(o) + _plot(plot_png)
            + _records_table("Remediated", o.remedies, "remedies")
            + _records_table("World size changes", o.world_size_changes, "world-size-changes")
            + _membership(o)
            + _checkpoints(o) + _metrics(o) + _attempts(o))
    return _document(title, body)


def unavailable(title: str, why: str) -> str:
    """A page that says why the run cannot be shown (no run folder yet, a store the API server cannot read)."""
    return _document(title, f'<h1>{_e(title)}</h1><p class="problem" data-testid="unavailable">{_e(why)}</p>')


def _document(title: str, body: str) -> str:
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{_e(title)}</title><style>{STYLE}</style>'
            f"</head><body>{body}</body></html>")
