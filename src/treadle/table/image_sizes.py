"""The encoding and sizes of a binary column of images, recorded when it is written.

Every write (``append``, ``append_episode``, the importers through them) reads the header
of each value of a binary column whose first value is a JPEG, PNG or WebP, and keeps in
the table's schema metadata (``treadle:images``, so it travels with every Lance version)
per column: the format of its first image and each distinct size with the first episode
that has it (at most :data:`MAX_SIZES` sizes; ``more`` says others were seen), whether the
first is 16-bit, whether a value is null (``nulls``), and the first value a ``td.Video``
cannot read beside the others (``odd``: episode, frame and what it is: not an image, or of
the other bit depth). A plan then knows, before step 0, that a column holds more than one
size (see :mod:`treadle.plan.image_columns`), or that a window reads a value it cannot
decode (:mod:`treadle.plan.null_rows`), without reading a frame.

Each size also keeps the episodes that hold it (``names``: ``{"WxH": [episode, ...]}``, at
most :data:`MAX_NAMES` a size; ``names_more``: the sizes more episodes hold than listed),
so that deleting or purging episodes (:func:`images_without`) takes their names out, and a
size no episode left holds goes. A size whose holders are not all listed (past the cap, or
recorded by an earlier treadle, which kept no ``names``) stays: a plan may then ask for a
``size=`` the column no longer needs, never the other way.

An image column also gets Lance's ``lance-encoding:compression: none`` field hint: encoded
images do not compress, yet Lance 2.2 zstd-compresses large binary values that compress a
little (PNGs), which costs a take ~3x the CPU and keeps the loader from reading values
straight from the data file (:mod:`treadle.read.file_values`). Lance keeps the hint of
the schema a table is created with; a table created before this keeps its encoding.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from treadle.table.episodes import EPISODE, FRAME
from treadle.video.image_decode import image_header, signature

IMAGES_KEY = b"treadle:images"
MAX_SIZES = 16
#: Episodes a size's entry names (the first written); past it the size is in ``names_more``.
MAX_NAMES = 32
#: Lance's field hint an image column is written with (see above)
UNCOMPRESSED = {b"lance-encoding:compression": b"none"}


def is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def recorded_images(schema: pa.Schema | None) -> dict[str, dict[str, Any]]:
    """``{column: {"format", "sizes": [[width, height, episode], ...], "more"}}`` as recorded."""
    raw = (schema.metadata or {}).get(IMAGES_KEY) if schema is not None else None
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}  # not trusted: read-time checks still hold every frame to the first's size
    return value if isinstance(value, dict) else {}


def with_image_sizes(schema: pa.Schema, rows: pa.Table, where: str) -> pa.Schema:
    """``schema`` with the image sizes of ``rows`` merged into what it records (a column
    whose first value written is not an image is left out; a damaged value is a
    :class:`~treadle.errors.CorruptData` naming it, as it would be when read)."""
    have = recorded_images(schema)
    changed = False
    for f in rows.schema:
        if not is_binary(f.type) or f.name not in schema.names:
            continue
        col = rows.column(f.name)
        entry = have.get(f.name)
        if entry is None and not _starts_with_image(col):
            continue
        entry = _merged(entry, col, rows, f"{where}, column {f.name!r}")
        if entry is not None:
            have[f.name], changed = entry, True
    if not changed:
        return schema
    meta = dict(schema.metadata or {})
    meta[IMAGES_KEY] = json.dumps(have, sort_keys=True, separators=(",", ":")).encode()
    return _with_hints(schema.with_metadata(meta), set(have), UNCOMPRESSED)


def _with_hints(schema: pa.Schema, columns: set[str], hint: dict[bytes, bytes]) -> pa.Schema:
    """``schema`` with ``hint`` in the field metadata of ``columns`` (binary ones only;
    an empty ``hint``: :data:`UNCOMPRESSED` removed from every field)."""
    for i, f in enumerate(schema):
        meta = dict(f.metadata or {})
        if hint and f.name in columns and is_binary(f.type):
            meta.update(hint)
        elif not hint:
            for k in UNCOMPRESSED:
                meta.pop(k, None)
        if meta != dict(f.metadata or {}):
            schema = schema.set(i, f.with_metadata(meta) if meta else f.remove_metadata())
    return schema


def _starts_with_image(col: pa.ChunkedArray) -> bool:
    for chunk in col.chunks:
        for v in chunk:
            if v.is_valid:
                return signature(v.as_buffer()) is not None
    return False


def _key(w: int, h: int) -> str:
    return f"{w}x{h}"


def _holders(entry: dict[str, Any]) -> tuple[dict[str, list[str]], set[str]]:
    """``(names, names_more)`` of ``entry``; a size the record keeps no names of (an
    earlier treadle's record, or a size an earlier treadle added to this one) is one whose
    holders are not all known."""
    names = {k: list(v) for k, v in (entry.get("names") or {}).items()}
    unnamed = {_key(w, h) for w, h, _ in entry.get("sizes") or []} - names.keys()
    return names, set(entry.get("names_more") or ()) | unnamed


def _hold(names: dict[str, list[str]], more: set[str], key: str, episode: Any) -> None:
    """Record that ``episode`` holds size ``key`` (None: an unnamed row)."""
    held = names.setdefault(key, [])
    if episode is None or (episode not in held and len(held) >= MAX_NAMES):
        more.add(key)
    elif episode not in held:
        held.append(episode)


def _state(entry: dict[str, Any]) -> tuple:
    return tuple(json.dumps(entry.get(k), sort_keys=True) for k in
                 ("sizes", "format", "more", "odd", "nulls", "names", "names_more"))  # fmt: skip


def _merged(
    entry: dict[str, Any] | None, col: pa.ChunkedArray, rows: pa.Table, where: str
) -> dict[str, Any] | None:
    entry = dict(entry or {"sizes": [], "more": False, "names": {}})
    sizes = [tuple(s) for s in entry["sizes"]]
    seen = {(w, h) for w, h, _ in sizes}
    before = _state(entry)
    held, held_more = _holders(entry)
    names = rows.column(EPISODE).to_pylist() if EPISODE in rows.column_names else None
    frames = rows.column(FRAME).to_pylist() if FRAME in rows.column_names else None
    row, last = -1, None
    for chunk in col.chunks:
        for v in chunk:
            row += 1
            if not v.is_valid:
                entry.setdefault("nulls", True)
                continue
            data = v.as_buffer()
            if signature(data) is None:
                _odd(entry, names, frames, row, "not a JPEG, PNG or WebP image")
                continue  # a td.Video over it is refused when planned (plan.image_columns)
            head = image_header(data, f"{where}, row {row} of the write")
            entry.setdefault("format", head.format)
            entry.setdefault("depth16", head.depth16)
            if head.depth16 != entry["depth16"]:
                what = "a 16-bit image among 8-bit ones" if head.depth16 else "an 8-bit image"
                _odd(
                    entry, names, frames, row, what + ("" if head.depth16 else " among 16-bit ones")
                )
            size = (head.width, head.height)
            if size not in seen:
                if len(sizes) < MAX_SIZES:
                    sizes.append((*size, names[row] if names else None))
                    seen.add(size)
                else:
                    entry["more"] = True
                    continue
            episode = names[row] if names else None
            if (size, episode) != last or episode is None:  # an episode's rows run together
                _hold(held, held_more, _key(*size), episode)
                last = (size, episode)
    entry["sizes"] = [list(s) for s in sizes]
    entry["names"], entry["names_more"] = held, sorted(held_more)
    return entry if _state(entry) != before else None


def _odd(entry: dict[str, Any], names: Any, frames: Any, row: int, what: str) -> None:
    """Keep the first value a td.Video cannot read beside the others: its episode, frame
    (None where the rows have no such column) and what it is."""
    if "odd" not in entry:
        entry["odd"] = [names[row] if names else None, frames[row] if frames else None, what]


def without_images(schema: pa.Schema) -> pa.Schema:
    """``schema`` with no recorded image sizes nor image fields' hints (to compare schemas
    staged apart)."""
    schema = _with_hints(schema, set(), {})
    meta = dict(schema.metadata or {})
    if meta.pop(IMAGES_KEY, None) is None:
        return schema
    return schema.with_metadata(meta) if meta else schema.remove_metadata()


def merge_images(schema: pa.Schema, other: pa.Schema) -> pa.Schema:
    """``schema`` recording the image sizes of both (rows staged in another process: each
    column's first format and sizes first, then the other's sizes it lacks; the episodes
    of each size of both)."""
    mine, theirs = recorded_images(schema), recorded_images(other)
    if not theirs:
        return schema
    for col, rec in theirs.items():
        entry = mine.setdefault(
            col, {"format": rec.get("format"), "sizes": [], "more": False, "names": {}}
        )
        held, held_more = _holders(entry)
        their_held, their_more = _holders(rec)
        seen = {(w, h) for w, h, _ in entry["sizes"]}
        for w, h, e in rec.get("sizes") or []:
            if (w, h) in seen:
                continue
            if len(entry["sizes"]) < MAX_SIZES:
                entry["sizes"].append([w, h, e])
                seen.add((w, h))
            else:
                entry["more"] = True
        for w, h, _ in entry["sizes"]:
            key = _key(w, h)
            for episode in their_held.get(key, ()):
                _hold(held, held_more, key, episode)
            if key in their_more:
                held_more.add(key)
        entry["names"], entry["names_more"] = held, sorted(held_more)
        entry["more"] = bool(entry["more"] or rec.get("more"))
        for key in ("odd", "nulls", "depth16"):  # the first writer's, as for the format
            if key in rec and key not in entry:
                entry[key] = rec[key]
    meta = dict(schema.metadata or {})
    meta[IMAGES_KEY] = json.dumps(mine, sort_keys=True, separators=(",", ":")).encode()
    return schema.with_metadata(meta)


def images_without(schema: pa.Schema, episodes: Iterable[str]) -> str | None | bool:
    """The image record's text once ``episodes`` are deleted or purged (None: no record
    left; False: unchanged): their names go from every size (a size no episode holds any
    more goes too), and ``odd`` when its value was theirs."""
    gone = set(episodes).__contains__
    raw = recorded_images(schema)
    out: dict[str, dict[str, Any]] = {}
    for col, rec in raw.items():
        named = {e for _, _, e in rec.get("sizes") or []} | {(rec.get("odd") or [None])[0]}
        named |= {n for v in (rec.get("names") or {}).values() for n in v}
        if not any(gone(n) for n in named):
            out[col] = rec
            continue
        entry = dict(rec)
        held, held_more = _holders(entry)
        sizes = []
        for w, h, e in entry.get("sizes") or []:
            key = _key(w, h)
            left = [n for n in held.get(key, ()) if not gone(n)]
            if not left and key not in held_more:
                held.pop(key, None)
                continue  # every episode that held it is gone
            held[key] = left
            sizes.append([w, h, (left[0] if left else None) if gone(e) else e])
        entry["sizes"], entry["names"], entry["names_more"] = sizes, held, sorted(held_more)
        if gone((entry.get("odd") or [None])[0]):
            del entry["odd"]
        out[col] = entry
    return False if out == raw else json.dumps(out, sort_keys=True, separators=(",", ":"))


def images_updated(
    schema: pa.Schema, column: str, width: int, height: int, episodes: Iterable[str]
) -> str | bool:
    """The image record's text once ``update`` wrote an image of ``width`` x ``height`` into
    rows of ``episodes`` of ``column`` (False: unchanged): they hold that size too."""
    raw = recorded_images(schema)
    entry = raw.get(column)
    key = _key(width, height)
    if entry is None or [width, height] not in [s[:2] for s in entry.get("sizes") or []]:
        return False  # a size not listed: "more" holds it (update refuses any other)
    entry = dict(entry)
    held, held_more = _holders(entry)
    for episode in episodes:
        _hold(held, held_more, key, episode)
    entry["names"], entry["names_more"] = held, sorted(held_more)
    if entry == raw[column]:
        return False
    return json.dumps({**raw, column: entry}, sort_keys=True, separators=(",", ":"))
