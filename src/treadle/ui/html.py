"""HTML building blocks of the viewer's pages: escaping, links, tables, the page frame.

Every value that reaches a page goes through :func:`esc` (names, messages, schema text);
no page shows a store's credentials or storage options (:func:`safe_root` drops the user
part of a URL root).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

STATIC = Path(__file__).parent / "static"
"""The viewer's own assets (CSS, JS): served from the package, never from a network."""


def esc(value: Any) -> str:
    """``value`` as text safe inside HTML elements and quoted attributes."""
    return html.escape(str(value), quote=True)


def url(*parts: Any, **query: Any) -> str:
    """``/a/b?k=v`` from path segments (each percent-quoted) and query values (None left out)."""
    return url_with("/" + "/".join(quote(str(p), safe="") for p in parts), **query)


def episode_url(project: str, table: str, version: int, episode: str, suffix: str = "",
                **query: Any) -> str:  # fmt: skip
    """The URL of an episode's page (``suffix``: one of its resources, ``/data.json``...).

    Any name the write API accepts works: percent-quoted in the path (``.../e/pick%20up``),
    or, when a path cannot carry it (a ``/`` in it, or a name that is only dots), as the
    ``name`` query parameter of ``.../episode``."""
    base = url("p", project, "t", table, "v", version)
    if "/" in episode or not episode.strip("."):
        return url_with(f"{base}/episode{suffix}", name=episode, **query)
    return url_with(f"{base}/e/{quote(episode, safe='')}{suffix}", **query)


def url_with(path: str, **query: Any) -> str:
    """``path`` with query values (each percent-quoted; None left out)."""
    q = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in query.items() if v is not None)
    return path + (f"?{q}" if q else "")


def link(href: str, text: Any, **attrs: str) -> str:
    extra = "".join(f' {k.rstrip("_")}="{esc(v)}"' for k, v in attrs.items())
    return f'<a href="{esc(href)}"{extra}>{esc(text)}</a>'


def when(seconds: float) -> str:
    """A commit time as ``2026-12-01 22:14:48 UTC``."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def safe_root(root: str) -> str:
    """The store root without any ``user:password@`` part."""
    parts = urlsplit(root)
    if parts.scheme and parts.netloc and "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return root


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], *, raw: bool = False,
          id_: str | None = None) -> str:  # fmt: skip
    """An HTML table; cells are escaped unless ``raw`` (cells already HTML)."""
    cell = (lambda v: str(v)) if raw else esc
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    ident = f' id="{esc(id_)}"' if id_ else ""
    return f"<table{ident}><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def crumbs(*items: tuple[str, str] | str) -> str:
    """The breadcrumb line: ``(href, text)`` links, a plain string for the current page."""
    out = [link("/", "treadle")]
    for it in items:
        out.append(link(*it) if isinstance(it, tuple) else f"<span>{esc(it)}</span>")
    return '<nav class="crumbs">' + " / ".join(out) + "</nav>"


def page(title: str, body: str, *, nav: str = "", scripts: Sequence[str] = (),
         inline: bool = False) -> str:  # fmt: skip
    """A whole page. ``inline``: CSS and scripts are embedded (a file that needs no server)."""
    if inline:
        css = f"<style>{(STATIC / 'viewer.css').read_text()}</style>"
        js = "".join(f"<script>{(STATIC / s).read_text()}</script>" for s in scripts)
    else:
        css = (
            '<link rel="stylesheet" href="/static/viewer.css">'
            '<link rel="icon" href="/favicon.ico" type="image/svg+xml">'
        )
        js = "".join(f'<script src="/static/{esc(s)}"></script>' for s in scripts)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)} · treadle</title>{css}</head>"
        f"<body>{nav}<main><h1>{esc(title)}</h1>{body}</main>{js}</body></html>"
    )


def error_page(status: int, message: str) -> str:
    """A 404 (or other) page that says what was not found."""
    return page(f"{status}", f'<p class="error">{esc(message)}</p>', nav=crumbs())
