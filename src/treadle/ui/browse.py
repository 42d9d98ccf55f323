"""The store pages: projects, a project (branches, tags, commit log), a commit, a table.

Each function takes the viewer's :class:`~treadle.catalog.Client` and names checked by
:func:`treadle.names.check_name` (the caller's job: a bad name is a 404 naming it) and
returns HTML or a JSON-ready dict. Nothing here writes to the store; the episode list of a
table is served in pages (``offset``, ``limit``), never as a whole.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from treadle.ui.html import crumbs, episode_url, esc, link, page, safe_root, table, url, when
from treadle.ui.image_frames import image_cameras

if TYPE_CHECKING:
    from treadle.catalog.client import Project

PAGE = 100
"""Episodes per page of a table's episode list (the largest ``limit`` a request may ask)."""


def projects_page(client: Any) -> str:
    rows = []
    for name in client.projects():
        branches = client.project(name, create=False).branches()
        rows.append([link(url("p", name), name), esc(", ".join(branches)),
                     link(url("p", name, "runs"), "runs")])  # fmt: skip
    body = f"<p>store <code>{esc(safe_root(client.root))}</code></p>"
    body += table(["project", "branches", ""], rows, raw=True, id_="projects")
    return page("projects", body, nav=crumbs())


def _changed(project: Project, commit: Any) -> str:
    """The tables whose version differs from the first parent's (``name v2 -> v3``)."""
    before: dict[str, int] = {}
    if commit.parents:
        before = project.load_commit(commit.parents[0]).tables
    out = []
    for name, v in sorted(commit.tables.items()):
        if before.get(name) != v:
            out.append(f"{name} v{before[name]}→v{v}" if name in before else f"{name} v{v} (new)")
    out += [f"{n} (removed)" for n in sorted(set(before) - set(commit.tables))]
    return ", ".join(out) or "-"


def project_page(client: Any, name: str, branch: str = "main", limit: int = 50,
                 offset: int = 0) -> str:  # fmt: skip
    project = client.project(name, create=False)
    b = project.branch(branch)
    offset = max(0, offset)
    heads = [[link(url("p", name, branch=n), n), link(url("p", name, "c", project.branch(n)
             .commit_id), project.branch(n).commit_id[:8])] for n in project.branches()]  # fmt: skip
    tags = [
        [esc(t), link(url("p", name, "c", c), c[:8])] for t, c in sorted(project.tags().items())
    ]
    log = [
        [link(url("p", name, "c", c.id), c.short_id), esc(when(c.time)), esc(c.message),
         esc(c.summary or "-"), esc(_changed(project, c))]
        for c in b.log(limit=offset + limit + 1)[offset:]
    ]  # fmt: skip
    more = len(log) > limit
    log = log[:limit]
    pager = " · ".join(
        link(url("p", name, branch=branch, offset=o or None), text)
        for o, text, show in ((max(0, offset - limit), "← newer", offset > 0),
                              (offset + limit, "older →", more)) if show
    )  # fmt: skip
    body = "<h2>branches</h2>" + table(["branch", "head"], heads, raw=True, id_="branches")
    body += "<h2>tags</h2>" + (table(["tag", "commit"], tags, raw=True, id_="tags") if tags
                               else '<p class="muted">no tags</p>')  # fmt: skip
    body += f"<p>{link(url('p', name, 'runs'), 'runs of this project')}</p>"
    body += f"<h2>log of {esc(branch)}</h2>"
    span = f"commits {offset + 1}–{offset + len(log)}" if log else "no commits here"
    body += f'<p class="pager" id="log-pager">{span}{" · " + pager if pager else ""}</p>'
    body += table(["commit", "time", "message", "changes", "tables changed"], log, raw=True,
                  id_="log")  # fmt: skip
    return page(f"project {name}", body, nav=crumbs(name))


def commit_page(client: Any, name: str, commit_id: str) -> str:
    project = client.project(name, create=False)
    c = project.commit(commit_id)
    rows = []
    for t, v in sorted(c.tables.items()):
        tab = project.table_at(t, v, c.id)
        rows.append([link(url("p", name, "t", t, "v", v), t), v, f"{tab.num_moments:,}",
                     f"{tab.num_episodes:,}" if tab.is_time_indexed else "-",
                     esc(", ".join([*tab.video_columns, *image_cameras(tab)]) or "-")])  # fmt: skip
    body = f"<p>{esc(c.message)} · {esc(when(c.time))} · <code>{esc(c.id)}</code></p>"
    body += table(["table", "version", "moments", "episodes", "cameras"], rows, raw=True,
                  id_="tables")  # fmt: skip
    return page(f"commit {c.short_id}", body, nav=crumbs((url("p", name), name), c.short_id))


def _schema_rows(tab: Any) -> list[list[str]]:
    rows = []
    images = image_cameras(tab)
    for f in tab.schema:
        kind = "video" if f.name in tab.video_columns else str(f.type)
        if f.name in images:
            kind = f"images ({images[f.name].label})"
        shape = (f.metadata or {}).get(b"treadle:shape", b"").decode()
        rows.append([f.name, kind if not shape else f"{kind} shape {shape}"])
    return rows


def table_page(client: Any, name: str, tname: str, version: int) -> str:
    tab = client.table(name, tname, version)
    fps = tab.fps
    facts = [["moments", f"{tab.num_moments:,}"],
             ["episodes", f"{tab.num_episodes:,}" if tab.is_time_indexed else "- (no time axis)"],
             ["fps", "-" if fps is None else f"{fps:g}"], ["version", str(version)]]  # fmt: skip
    base = url("p", name, "t", tname, "v", version)
    src = tab.source_stats()
    body = table(["", ""], facts, id_="facts") + "<h2>schema</h2>"
    body += table(["column", "type"], _schema_rows(tab), id_="schema")
    body += (
        f'<h2>episodes</h2><div id="episodes" data-src="{esc(base)}/episodes.json" '
        f'data-total="{tab.num_episodes}"><p class="muted">loading…</p></div>'
        f'<h2>statistics</h2><div id="stats" data-src="{esc(base)}/stats">'
        '<button type="button" id="compute-stats">compute table.stats</button> '
        '<span class="muted">(a POST: computed once per version and kept, as '
        "td.Table.stats)</span></div>"
        "<h2>source statistics</h2>"
        + (f'<pre id="source-stats">{esc(_jsonable_text(src))}</pre>' if src
           else '<p class="muted" id="source-stats">none shipped with this table</p>')
    )  # fmt: skip
    return page(f"table {tname} v{version}", body, scripts=["viewer.js"],
                nav=crumbs((url("p", name), name), f"{tname} v{version}"))  # fmt: skip


def episodes_json(client: Any, name: str, tname: str, version: int, offset: int,
                  limit: int, filter_: str | None = None) -> dict[str, Any]:  # fmt: skip
    """One page of a table's episodes: name, first moment, length, the episode page link
    (``filter_``: only names that hold it, case-insensitive; ``total`` counts those)."""
    tab = client.table(name, tname, version)
    index = tab.episodes()
    chosen: Any = range(len(index.names))
    if filter_:
        needle = filter_.lower()
        chosen = [i for i, n in enumerate(index.names) if needle in n.lower()]
    total = len(chosen)
    offset, limit = max(0, offset), max(1, min(PAGE, limit))
    rows = [
        {"index": i, "name": index.names[i], "start": int(index.starts[i]),
         "length": int(index.lengths[i]),
         "href": episode_url(name, tname, version, index.names[i])}
        for i in chosen[offset : offset + limit]
    ]  # fmt: skip
    return {"total": total, "offset": offset, "episodes": rows}


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {k: _jsonable(getattr(value, k)) for k in value.__dataclass_fields__}
    return value


def _jsonable_text(value: Any) -> str:
    return json.dumps(_jsonable(value), indent=1, default=str)


def stats_json(tab: Any) -> dict[str, Any]:
    """``table.stats()`` of a pinned table (computed on first ask and kept, as the API
    does: the viewer's one write, asked for by a POST)."""
    stats = tab.stats()
    return {col: _js_exact(_jsonable(s)) for col, s in stats.items()}


def _js_exact(value: Any) -> Any:
    """Integers JavaScript's numbers cannot hold (past ``2**53``: an integer column's min
    and max, nanosecond timestamps) as their decimal text, which the page shows as is;
    as numbers, ``JSON.parse`` rounds them and the page showed the rounded integer."""
    if isinstance(value, dict):
        return {k: _js_exact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_js_exact(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return str(value)
    return value


def numeric_columns(tab: Any) -> list[str]:
    """Columns plotted over time: numbers and fixed-size lists of numbers."""
    out = []
    for f in tab.schema:
        t = f.type
        inner = t.value_type if pa.types.is_fixed_size_list(t) else t
        if f.name in ("episode", "frame") or f.name in tab.video_columns:
            continue
        if pa.types.is_integer(inner) or pa.types.is_floating(inner) or pa.types.is_boolean(inner):
            out.append(f.name)
    return out
