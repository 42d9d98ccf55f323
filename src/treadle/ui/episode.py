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
MAX_PLOTTED = 2_000_000
"""Values an episode's plots carry in all (rows x plotted dimensions): a table of many
numeric columns plots its first ``MAX_PLOTTED // dimensions`` rows (``shown``; the page
says so)."""
READ_VALUES = 1 << 21
"""Values read at once for the plots (rows x every dimension of the numeric columns): a
wide column (an embedding of 2048 floats per row) is read in blocks of rows, never whole."""
TEXT_BYTES = 16 << 20
"""About how many bytes of text columns are read at once."""


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


def _as_series(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """The first :data:`MAX_DIMS` dimensions of a numeric column as float64 ``[rows, d]``
    (a scalar column is one dimension; null rows NaN) and its null rows."""
    arr = column.combine_chunks()
    is_list = pa.types.is_fixed_size_list(arr.type)
    n = arr.type.list_size if is_list else 1
    nulls = arr.is_null().to_numpy(zero_copy_only=False)
    flat = np.full((len(arr), min(n, MAX_DIMS)), np.nan)  # an added column: null where never set
    values = arr.drop_null().flatten() if is_list else arr.drop_null()
    values = values.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    flat[~nulls] = values.reshape(-1, n)[:, :MAX_DIMS]
    return flat, nulls


def _width(t: pa.DataType) -> int:
    return t.list_size if pa.types.is_fixed_size_list(t) else 1


def _row_blocks(start: int, count: int, per_block: int) -> Any:
    """Row numbers ``start .. start+count`` in blocks of at most ``per_block``."""
    for a in range(0, count, per_block):
        yield np.arange(start + a, start + min(count, a + per_block), dtype=np.int64)


def _series(tab: Any, nums: list[str], start: int, shown: int) -> tuple[dict, dict]:
    """Per numeric column and plotted dimension, the values of rows ``start..start+shown``
    (a null, NaN or infinite value is None: strict JSON, a gap in the plot), and per
    column how many were NaN or infinite. Read in blocks of :data:`READ_VALUES` values."""
    width = sum(_width(tab.schema.field(c).type) for c in nums)
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {c: [] for c in nums}
    for rows in _row_blocks(start, shown if nums else 0, max(1, READ_VALUES // max(1, width))):
        got = tab.take(rows, nums)
        for c in nums:
            parts[c].append(_as_series(got.column(c)))
    series, nonfinite = {}, {}
    for c, blocks in parts.items():
        flat = np.concatenate([f for f, _ in blocks])
        nulls = np.concatenate([n for _, n in blocks])
        bad = ~np.isfinite(flat)
        if int(bad[~nulls].sum()):
            nonfinite[c] = int(bad[~nulls].sum())
        values = flat.astype(object)
        values[bad | nulls[:, None]] = None
        series[c] = [values[:, d].tolist() for d in range(values.shape[1])]
    return series, nonfinite


def _texts(tab: Any, texts: list[str], start: int, count: int) -> dict[str, list[str]]:
    """The first :data:`MAX_TEXTS` distinct values of each text column in rows
    ``start..start+count`` (each cut to :data:`MAX_TEXT` characters), read in blocks of
    about :data:`TEXT_BYTES` and only until each column has its :data:`MAX_TEXTS`."""
    found: dict[str, dict[str, None]] = {c: {} for c in texts}
    a, per_block = 0, 1024
    while texts and a < count and any(len(v) < MAX_TEXTS for v in found.values()):
        got = tab.take(np.arange(start + a, start + min(count, a + per_block), dtype=np.int64),
                       texts)  # fmt: skip
        for c in texts:
            for v in got.column(c).unique().drop_null().to_pylist():
                if len(found[c]) < MAX_TEXTS:
                    found[c].setdefault(v)
        a += got.num_rows
        per_block = max(1, min(1 << 16, TEXT_BYTES * got.num_rows // max(1, got.nbytes)))
    return {c: sorted(v[:MAX_TEXT] for v in values) for c, values in found.items()}


def episode_data(client: Any, name: str, tname: str, version: int, episode: str) -> dict:
    """The numbers and strings of one episode: its first :data:`MAX_ROWS` rows, fewer
    when its numeric columns plot more than :data:`MAX_PLOTTED` values (``shown``)."""
    tab = client.table(name, tname, version)
    _, start, length = find_episode(tab, episode)
    nums = numeric_columns(tab)
    texts = [f.name for f in tab.schema
             if f.name != "episode" and (pa.types.is_string(f.type)
                                         or pa.types.is_large_string(f.type))]  # fmt: skip
    dims = {c: _width(tab.schema.field(c).type) for c in nums}
    plotted = sum(min(d, MAX_DIMS) for d in dims.values())
    shown = min(length, MAX_ROWS, max(1, MAX_PLOTTED // max(1, plotted)))
    series, nonfinite = _series(tab, nums, start, shown)
    tasks = _texts(tab, texts, start, min(length, MAX_ROWS))
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
