"""Runs: every run record a project knows, its card as a page, its per-step composition.

A project knows a run when a table on one of its branches has string columns ``run_id``
and ``record`` holding it: the rows :class:`td.Checkpoints` writes, and any table a user
saves ``plan.record.to_json()`` in the same two columns. Records are read from each
branch head (two columns only) and checked by :meth:`RunRecord.from_json`.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle.errors import NotFound, TreadleError
from treadle.plan.card import kept_text, render_card, share_text, windows_text
from treadle.plan.plan import Plan
from treadle.plan.record import RunRecord
from treadle.ui.html import crumbs, esc, link, page, table, url

if TYPE_CHECKING:
    from treadle.catalog.client import Project

_RUN_ID = re.compile(r"[0-9a-f]{16}")
RECORD_BYTES = 16 << 20
"""About how many bytes of a run-record table the runs pages read at once."""
_RUN_ID_PREFIX = re.compile(r"[0-9a-f]{4,16}")


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is 16 hex digits (as :attr:`RunRecord.run_id`), else NotFound."""
    if not _RUN_ID.fullmatch(run_id):
        raise NotFound(f"{run_id!r} is not a run id (16 hex digits)")
    return run_id


def check_run_id_prefix(run_id: str) -> str:
    """``run_id`` if it is a run id or a prefix of one of 4 digits or more (``treadle log``
    prints 8), else NotFound."""
    if not _RUN_ID_PREFIX.fullmatch(run_id):
        raise NotFound(
            f"{run_id!r} is not a run id (16 hex digits, or a unique prefix of one such as "
            "the 8 that treadle log prints)"
        )
    return run_id


def _record_tables(project: Project, commit: Any) -> list[Any]:
    out = []
    for name, version in sorted(commit.tables.items()):
        tab = project.table_at(name, version, commit.id)
        fields = {f.name: f.type for f in tab.schema}
        if all(pa.types.is_string(fields.get(c, pa.null())) for c in ("run_id", "record")):
            out.append(tab)
    return out


def _record(text: str | None) -> RunRecord | None:
    try:
        return RunRecord.from_json(text or "")
    except (TreadleError, ValueError, TypeError, KeyError, RecursionError):
        return None


def _step(value: Any) -> int | None:
    """A checkpoint row's step: an integer (a bool, text or fraction is no step)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"its step column holds {type(value).__name__} {value!r}, not an integer")
    return value


def _rows(tab: Any, cols: list[str]) -> Any:
    """The rows of ``cols`` as dicts, read in blocks of about :data:`RECORD_BYTES` (a
    table of records is read whole, but never held whole)."""
    a, per_block, total = 0, 16, tab.num_moments
    while a < total:
        got = tab.take(np.arange(a, min(total, a + per_block), dtype=np.int64), cols)
        yield from got.to_pylist()
        a += got.num_rows
        per_block = max(1, min(1 << 16, RECORD_BYTES * got.num_rows // max(1, got.nbytes)))


def _table_runs(tab: Any, branch: str, runs: dict[str, dict[str, Any]]) -> int:
    """Add the run records of one table to ``runs``; how many rows hold none. ValueError
    (or what reading it raises) when the table only looks like run records."""
    cols = ["run_id", "record"] + (["step"] if "step" in tab.schema.names else [])
    found: dict[str, dict[str, Any]] = {}
    bad = 0
    for row in _rows(tab, cols):
        run = found.get(row["run_id"]) or runs.get(row["run_id"])
        if run is None:
            record = _record(row["record"])
            if record is None or record.run_id != row["run_id"]:
                bad += 1
                continue
            run = found[record.run_id] = {"record": record, "where": set(), "steps": set()}
        step = _step(row.get("step"))
        run["where"].add(f"{tab.name} @ {branch}")
        if step is not None:
            run["steps"].add(step)
    runs.update(found)
    return bad


def find_runs(project: Project) -> dict[str, dict[str, Any]]:
    """``{run_id: {"record": RunRecord, "where": [...], "steps": [...]}}`` of every branch,
    and under ``""`` the tables that only look like run records (``{"skipped": {where:
    why}}``): they are named on the runs page, never a failure of it."""
    runs: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for branch in project.branches():
        commit = project.branch(branch).head()
        for tab in _record_tables(project, commit):
            try:
                bad = _table_runs(tab, branch, runs)
                if bad:
                    skipped[f"{tab.name} @ {branch}"] = f"{bad} rows hold no run record"
            except (TreadleError, ValueError, TypeError, KeyError, RecursionError,
                    pa.ArrowException) as e:  # fmt: skip
                why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                skipped[f"{tab.name} @ {branch}"] = why
    return {**runs, "": {"skipped": skipped}} if skipped else runs


class Runs:
    """Run records and their plans, found once per set of branch heads (thread-safe LRU)."""

    def __init__(self, client: Any, plans: int = 8):
        self.client = client
        self._lock = threading.Lock()
        self._found: dict[str, tuple[tuple[str, ...], dict[str, dict[str, Any]]]] = {}
        """Per project: the branch heads the runs were found at, and the runs (the newest)."""
        self._plans: OrderedDict[tuple[str, str], Plan] = OrderedDict()
        """Plans by (project, run id): a run opens only under its own project."""
        self._max = plans

    def all(self, name: str) -> dict[str, dict[str, Any]]:
        project = self.client.project(name, create=False)
        heads = tuple(project.branch(b).commit_id for b in project.branches())
        with self._lock:
            seen, found = self._found.get(name, ((), {}))
        if seen != heads:
            found = find_runs(project)
            with self._lock:
                self._found[name] = (heads, found)
        return found

    def runs(self, name: str) -> dict[str, dict[str, Any]]:
        """The runs of project ``name`` (what :meth:`all` found, less the skipped tables)."""
        return {k: v for k, v in self.all(name).items() if k}

    def skipped(self, name: str) -> dict[str, str]:
        """Tables of project ``name`` that only look like run records, and why."""
        return self.all(name).get("", {}).get("skipped", {})

    def plan(self, name: str, run_id: str) -> Plan:
        """The plan of run ``run_id`` of project ``name``: found in one of its tables, and
        pinning its tables (a record of another project's run is NotFound here)."""
        check_run_id(run_id)
        key = (name, run_id)
        with self._lock:
            if key in self._plans:
                self._plans.move_to_end(key)
                return self._plans[key]
        runs = self.runs(name)
        if run_id not in runs or runs[run_id]["record"].project != name:
            raise NotFound(f"project {name!r} knows no run {run_id!r} (see its runs page)")
        plan = Plan.from_record(runs[run_id]["record"], self.client)
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self._max:
                self._plans.popitem(last=False)
        return plan


def runs_page(runs: Runs, name: str) -> str:
    rows = []
    for run_id, run in sorted(runs.runs(name).items()):
        r = run["record"]
        steps = sorted(run["steps"])
        rows.append([link(url("p", name, "runs", run_id), run_id),
                     esc(", ".join(f"{t.name} v{t.version}" for t in r.tables)), r.batch_size,
                     r.seed, esc(", ".join(map(str, steps)) or "-"),
                     esc(", ".join(sorted(run["where"])))])  # fmt: skip
    body = table(["run", "tables", "batch", "seed", "checkpoint steps", "found in"], rows,
                 raw=True, id_="runs")  # fmt: skip
    if not rows:
        body += '<p class="muted">no run records (checkpoint rows or saved records)</p>'
    skipped = runs.skipped(name)
    if skipped:
        body += "<h2>skipped tables</h2><p>These tables have string <code>run_id</code> and "
        body += "<code>record</code> columns but hold no run records treadle can read:</p>"
        body += table(["table", "why"], sorted(skipped.items()), id_="skipped")
    return page(f"runs of {name}", body, nav=crumbs((url("p", name), name), "runs"))


def run_page(runs: Runs, name: str, run_id: str, world_size: int = 1) -> str:
    plan = runs.plan(name, run_id)
    plan.batch(0, 0, world_size)  # the step page's check: a bad world size is a 400 here too
    r = plan.record
    tabs = [[link(url("p", r.project, "t", t.name, "v", t.version), t.name), t.version,
             esc(t.branch or "-"), esc((t.commit or "-")[:8]), f"{t.num_moments:,}",
             f"{t.num_episodes:,}"] for t in r.tables]  # fmt: skip
    shares = []
    for i, c in enumerate(r.components):
        kept, moments = plan.kept(i)
        shares.append([i, esc(r.table_of(i).name), f"{c.weight:g}",
                       f"{float(r.asked_weights[i]):.6g}", f"{float(r.weights[i]):.6g}",
                       esc(share_text(r.asked_weights[i], r.weights[i])),
                       esc(kept_text(kept, moments)), esc(windows_text(c.windows))])  # fmt: skip
    steps = link(url("p", name, "runs", run_id, "steps", 0), "step 0")
    body = (
        f"<p>seed {r.seed} · batch {r.batch_size} · {steps}</p><h2>tables</h2>"
        + table(["table", "version", "branch", "commit", "moments", "episodes"], tabs, raw=True,
                id_="run-tables")
        + "<h2>shares</h2>"
        + table(["component", "table", "weight", "asked", "planned", "share", "kept", "windows"],
                shares, raw=True, id_="shares")
        + f'<h2>composition per step</h2><div id="composition" data-src="'
        f'{esc(url("p", name, "runs", run_id, "composition.json"))}" '
        f'data-names="{esc(",".join(r.table_of(i).name for i in range(r.num_components)))}">'
        '<p class="muted">loading…</p></div>'
        + f"<h2>card</h2><pre id=\"card\">{esc(render_card(r, world_size=world_size, plan=plan))}</pre>"
    )  # fmt: skip
    return page(
        f"run {run_id}",
        body,
        scripts=["plot.js", "viewer.js"],
        nav=crumbs((url("p", name), name), (url("p", name, "runs"), "runs"), run_id),
    )


def composition(plan: Plan, start: int, count: int) -> dict[str, Any]:
    """Samples per component in each of steps ``start .. start+count`` (at most 1000)."""
    start, count = max(0, start), max(1, min(1000, count))
    rows = [[int(n) for n in plan.counts(s)] for s in range(start, start + count)]
    return {"start": start, "counts": rows, "batch_size": plan.batch_size}
