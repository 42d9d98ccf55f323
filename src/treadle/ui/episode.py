"""The episode page: every video column playing in sync, every image column (a camera
stored as one JPEG/PNG/WebP per moment) as the frame under the cursor, numeric columns
plotted over time with a cursor that follows the video, task strings.

The page is HTML with ``data-`` attributes; ``static/viewer.js`` fetches the episode's
numbers (``data.json``) and draws the plots. Videos are the stored H.264 remuxed to MP4
(:mod:`treadle.ui.media`); the frame under the cursor is treadle's own decode (PNG), of
a video or of an image column's stored bytes (:mod:`treadle.ui.image_frames`), fetched per frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import NotFound
from treadle.ui.browse import numeric_columns
from treadle.ui.html import crumbs, episode_url, esc, link, page, url
from treadle.ui.image_frames import image_cameras
from treadle.video.column_layout import index_from_arrow
from treadle.video.cpu_reader import VideoReader

MAX_DIMS = 16
"""Dimensions plotted per tensor column (the first ones; the page says how many exist)."""
MAX_ROWS = 100_000
"""Rows an episode's plots read (the first ones): a table with no time axis is one
"episode" of every row, and a page never reads a whole large table."""
MAX_TEXTS, MAX_TEXT = 20, 200
"""Distinct values shown per text column, and characters shown of each."""


def check_episode_name(episode: str) -> str:
    """``episode`` if the write API could have written it (non-empty, printable), else
    NotFound naming it: the viewer opens every name a table can hold, and no other."""
    if not episode or any(ord(c) < 32 for c in episode):
        raise NotFound(f"invalid episode name {episode[:200]!r}: episode names are non-empty "
                       "printable strings")  # fmt: skip
    return episode


def find_episode(tab: Any, episode: str) -> tuple[int, int, int]:
    """``(index, first row, length)`` of ``episode`` in ``tab``; NotFound naming it."""
    check_episode_name(episode)
    index = tab.episodes()
    try:
        i = index.names.index(episode)
    except ValueError:
        raise NotFound(f"table {tab.name!r} v{tab.version} has no episode {episode!r}") from None
    return i, int(index.starts[i]), int(index.lengths[i])


def episode_page(client: Any, name: str, tname: str, version: int, episode: str,
                 frame: int = 0) -> str:  # fmt: skip
    tab = client.table(name, tname, version)
    i, start, length = find_episode(tab, episode)
    frame = min(max(0, int(frame)), max(0, length - 1))  # ?frame= out of range: the nearest
    base, _, query = episode_url(name, tname, version, episode).partition("?")
    query = f"?{query}" if query else ""
    videos = "".join(
        f'<figure><video muted playsinline preload="auto" data-column="{esc(c)}" '
        f'src="{esc(base)}/video/{esc(c)}.mp4{esc(query)}"></video><figcaption>{esc(c)} · '
        "treadle's decode of the frame under the cursor: "
        f'<img class="under" data-column="{esc(c)}" alt="frame {esc(c)}"></figcaption></figure>'
        for c in tab.video_columns
    )
    videos += _image_figures(tab, base, query, frame)
    index = tab.episodes()
    prev_next = [
        link(episode_url(name, tname, version, index.names[j]), label)
        for j, label in ((i - 1, "← previous"), (i + 1, "next →"))
        if 0 <= j < len(index.names)
    ]
    step = ('<button type="button" id="prev-frame" title="previous frame">◀</button>'
            '<button type="button" id="next-frame" title="next frame">▶</button> ')  # fmt: skip
    play = (f'<button type="button" id="play">play</button> {step}' if videos
            else '<span class="muted">no video or image column: </span>')  # fmt: skip
    body = (
        f'<p id="facts">episode {i:,} of {len(index.names):,} · {length:,} frames · '
        f"moments {start:,}..{start + length - 1:,} · {' · '.join(prev_next)}</p>"
        f'<div id="episode" data-src="{esc(base)}/data.json{esc(query)}" '
        f'data-frames="{length}" data-fps="{tab.fps or 30}" data-frame="{frame}" '
        f'data-base="{esc(base)}" data-query="{esc(query)}"><p>{play}'
        f'<input type="range" id="scrub" min="0" max="{max(0, length - 1)}" value="{frame}">'
        ' <span class="cursor">frame <b id="cursor-frame">0</b></span></p>'
        f'<div class="videos">{videos}</div><div id="tasks"></div><div id="values"></div>'
        '<div id="plots"><p class="muted">loading…</p></div></div>'
    )
    return page(f"{tname} / {episode}", body, scripts=["plot.js", "viewer.js"],
                nav=crumbs((url("p", name), name),
                           (url("p", name, "t", tname, "v", version), f"{tname} v{version}"),
                           episode))  # fmt: skip


def _image_figures(tab: Any, base: str, query: str, frame: int) -> str:
    """A figure per image column: the frame under the cursor (a 16-bit column stretched to
    its frame's min..max for the eye, ``?stretch=1``; the PNG without it holds the values)."""
    out = []
    for c, cam in image_cameras(tab).items():
        q = (query + ("&" if query else "?") + "stretch=1") if cam.depth16 else query
        note = " · shown stretched to the frame's min..max" if cam.depth16 else ""
        out.append(
            f'<figure class="camera"><img class="under camera" data-column="{esc(c)}" '
            f'data-stretch="{int(cam.depth16)}" alt="frame {esc(c)}" '
            f'src="{esc(base)}/frame/{esc(c)}/{frame}.png{esc(q)}"><figcaption>{esc(c)} · '
            f"{esc(cam.label)} · the stored image under the cursor, decoded{note}</figcaption>"
            "</figure>"
        )
    return "".join(out)


def _as_series(column: pa.ChunkedArray) -> tuple[list[list[float | None]], int]:
    """Per dimension, the values over time (a scalar column is one dimension; a null, NaN
    or infinite value is None: strict JSON, a gap in the plot), and how many were NaN or
    infinite."""
    arr = column.combine_chunks()
    is_list = pa.types.is_fixed_size_list(arr.type)
    n = arr.type.list_size if is_list else 1
    nulls = arr.is_null().to_numpy(zero_copy_only=False)
    flat = np.full((len(arr), n), np.nan)  # an added column is null where never set
    values = arr.drop_null().flatten() if is_list else arr.drop_null()
    flat[~nulls] = (
        values.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False).reshape(-1, n)
    )
    flat = flat[:, :MAX_DIMS]
    bad = ~np.isfinite(flat)
    nonfinite = int(bad[~nulls].sum())
    series = flat.astype(object)
    series[bad | nulls[:, None]] = None
    return [series[:, d].tolist() for d in range(series.shape[1])], nonfinite


def episode_data(client: Any, name: str, tname: str, version: int, episode: str) -> dict:
    """The numbers and strings of one episode (one take of its rows)."""
    tab = client.table(name, tname, version)
    _, start, length = find_episode(tab, episode)
    nums = numeric_columns(tab)
    texts = [f.name for f in tab.schema
             if f.name != "episode" and (pa.types.is_string(f.type)
                                         or pa.types.is_large_string(f.type))]  # fmt: skip
    shown = min(length, MAX_ROWS)
    rows = tab.take(np.arange(start, start + shown, dtype=np.int64), nums + texts)
    got = {c: _as_series(rows.column(c)) for c in nums}
    series = {c: s for c, (s, _) in got.items()}
    nonfinite = {c: n for c, (_, n) in got.items() if n}
    dims = {c: (rows.schema.field(c).type.list_size
                if pa.types.is_fixed_size_list(rows.schema.field(c).type) else 1)
            for c in nums}  # fmt: skip
    tasks = {}
    for c in texts:
        values = rows.column(c).unique().drop_null().to_pylist()
        tasks[c] = sorted(v[:MAX_TEXT] for v in values[:MAX_TEXTS])
    return {"frames": length, "shown": shown, "fps": tab.fps or 30.0, "series": series,
            "dims": dims, "nonfinite": nonfinite, "tasks": tasks,
            "videos": list(tab.video_columns),
            "images": {c: cam.label for c, cam in image_cameras(tab).items()}}  # fmt: skip


def decode_frame(client: Any, tab: Any, column: str, start: int, length: int,
                 frame: int) -> np.ndarray:  # fmt: skip
    """Frame ``frame`` of the episode at rows ``start..start+length`` as ``[H, W, 3]`` uint8,
    decoded by treadle (the pixels a loader delivers)."""
    from treadle.plan.windows import Video
    from treadle.video.fetch import WindowRequest

    if column not in tab.video_columns:
        raise NotFound(f"table {tab.name!r} has no video column {column!r}")
    if not 0 <= frame < length:
        raise NotFound(f"episode has frames 0..{length - 1}, not frame {frame}")
    rows = tab.take(np.arange(start, start + length, dtype=np.int64), [column])
    key, index = index_from_arrow(rows.column(column))
    with VideoReader(client.store, prefix=tab.project.prefix) as reader:
        req = WindowRequest(key, index, [frame], Video([0]), where=(tab.name, "", column))
        return np.asarray(reader.read([req])[0])[0]
