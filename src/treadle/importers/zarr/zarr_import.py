"""``td.importers.zarr``: a Diffusion Policy / UMI ``ReplayBuffer`` (Zarr) -> a table.

A ReplayBuffer is one Zarr group: ``data/<key>`` arrays of shape ``(N, ...)`` hold every
moment of every episode one after the other, and ``meta/episode_ends`` (``N_episodes``
increasing integers, the last one ``N``) splits them: episode ``i`` is rows
``episode_ends[i-1] .. episode_ends[i]`` and is named ``episode_{i:06d}``. Every key is a
column, stored exactly; ``uint8 [N, H, W, 3]`` arrays are cameras (``images``, see
:mod:`treadle.importers.cameras`). Zarr format 2 (what Diffusion Policy and UMI write) and
3 are read by ``zarr`` (an optional extra: ``pip install 'treadle[zarr]'``), from a
directory store or a ``.zip`` store, local or on an object store (copied to a temporary
folder first). Each episode is read alone (a slice of each array): memory stays bounded by
``max_episode_bytes``, which counts the chunks a slice inflates when they are larger than
the slice (:mod:`~treadle.importers.zarr.zarr_reads`). A codec that is not installed (UMI's JPEG XL frames need
``imagecodecs``) is a named error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import (
    CorruptData,
    MissingDependency,
    SchemaMismatch,
    UnsafeInput,
    UnsupportedFormat,
)
from treadle.importers.arrow import check_rename, column_name
from treadle.importers.cameras import Reports, camera_value, check_camera_mode, is_camera
from treadle.importers.episodic import (
    ROW_BYTES,
    Episode,
    LocalCopies,
    SourceMeta,
    import_episodes,
)
from treadle.importers.run import ImportOptions, ImportResult
from treadle.importers.sources import Source, split_url
from treadle.importers.zarr.zarr_reads import (
    check_zip_members,
    describe_chunks,
    read_cost,
    read_rows,
)

if TYPE_CHECKING:
    from treadle.catalog.client import Project
    from treadle.importers.executor import Executor

INSTALL = "pip install 'treadle[zarr]'"
MAX_EPISODE_BYTES = 4 << 30
#: episodes per executor task (each task opens the store once: on an object store, a copy)
EPISODES_PER_TASK = 16
#: the most episodes ``meta/episode_ends`` may list (it is read whole)
MAX_EPISODES = 10_000_000


def _zarr() -> Any:
    try:
        import zarr
    except ImportError as e:
        raise MissingDependency(
            f"Zarr imports need zarr ({e}); install it with: {INSTALL}"
        ) from None
    try:  # UMI's JPEG XL chunks: imagecodecs' codecs, when it is installed
        from imagecodecs.numcodecs import register_codecs

        register_codecs(verbose=False)  # zarr may have registered them: no line per codec
    except ImportError:
        pass
    return zarr


@dataclass(frozen=True)
class _Settings:
    images: str
    fps: float | None
    max_episode_bytes: int
    rename: dict[str, str] | None
    zip_name: str | None  # the .zip file of a zip store, else None (a directory store)


def import_zarr(
    src: str,
    project: Project,
    table: str,
    *,
    images: str = "video",
    fps: float | None = None,
    max_episode_bytes: int = MAX_EPISODE_BYTES,
    branch: str | None = None,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    client: Any = None,
    root: str | None = None,
    progress: bool | None = None,
    rename: dict[str, str] | None = None,
    executor: Executor | None = None,
    allow_pickle: bool = False,
) -> ImportResult:
    """Import a ReplayBuffer (``data/*`` + ``meta/episode_ends``) into ``table``; one commit.

    ``src``: a Zarr directory store or a ``.zip`` store (local or URL). ``images``:
    ``"video"`` (H.264, needs ``fps``; PSNR in the result) or ``"decoded"``; ``"encoded"`` is
    refused: Zarr chunks are codec-compressed arrays, not image files to keep. ``executor=td.RayExecutor()`` reads each run of 16 episodes in a Ray
    task. The group's attributes become ``table.metadata``. ``allow_pickle`` is accepted
    for a uniform CLI: an object-dtype array is refused, never unpickled.
    """
    _check_options(src, images, fps)
    _zarr()
    opts = ImportOptions.of({k: v for k, v in locals().items() if k != "images"})
    source, names, zip_name = _files(src, opts.source_options)
    settings = _Settings(images, fps, int(max_episode_bytes), opts.rename, zip_name)
    copies = LocalCopies(source)
    try:
        with _open(source, names, settings, copies) as group:
            data, ends, attrs = _layout(group, source.describe(zip_name or ""))
            _check_columns(list(data), opts.rename, source, zip_name)
        cameras = [k for k, a in data.items() if is_camera(a.shape, a.dtype)]
        if images == "video" and fps is None and cameras:  # a table of numbers needs no rate
            raise SchemaMismatch(
                f"{src}: camera data/{cameras[0]} as video needs fps= (--fps): a ReplayBuffer "
                "names no rate"
            )
        episodes = [f"episode_{i:06d}" for i in range(len(ends))]
        return import_episodes(
            opts,
            project,
            table,
            fmt="zarr",
            source=source,
            names=names,
            episodes=partial(_episodes, source, names, settings, episodes),
            options=opts.id_options("rename", images=images, fps=fps),
            fps=fps,
            images=images,
            meta=SourceMeta(attrs, {}, "zarr"),
            copies=copies,
            units=[f"{source.describe(zip_name or '')} {r[0]}..{r[-1]}" for r in _ranges(episodes)],
        )
    finally:
        copies.close()


def _check_columns(
    keys: list[str], rename: dict[str, str] | None, source: Source, zip_name: str | None
) -> None:
    """``rename`` names arrays there are, and each array gets its own column (else one
    array's values would replace another's)."""
    check_rename(rename, keys, f"Zarr store {source.describe()}")
    where = source.describe(zip_name or "")
    seen: dict[str, str] = {}
    for key in keys:
        name = column_name(key, where, rename)
        if name in seen:
            raise SchemaMismatch(
                f"{where}: arrays data/{seen[name]} and data/{key} both become column "
                f"{name!r} (rename={rename!r}); nothing was written"
            )
        seen[name] = key


def _check_options(src: str, images: str, fps: float | None) -> None:
    check_camera_mode(images)
    if images == "encoded":
        raise UnsupportedFormat(
            f"{src}: images='encoded' keeps a source's own image files, and a Zarr "
            "ReplayBuffer holds codec-compressed arrays, not image files: use images='video' "
            "(H.264, with fps=) or images='decoded'; nothing was written"
        )
    if fps is not None and not 0 < float(fps) < float("inf"):  # inf: no video, no seconds
        raise ValueError(f"fps must be a positive finite number, got {fps!r}")


def _files(src: str, options: dict[str, Any] | None) -> tuple[Source, list[str], str | None]:
    """``(source, its files, the .zip's name or None)`` of a directory or zip store."""
    src = str(src).rstrip("/")
    if src.lower().endswith(".zip"):
        root_dir, zip_name = split_url(src)
        return Source(root_dir, options), [zip_name], zip_name
    source = Source(src, options)
    names = source.list()
    if not names:
        raise CorruptData(f"{source.describe()}: {_not_a_store(src)}")
    return source, names, None


def _not_a_store(src: str) -> str:
    """Why ``src``, where no file lies under it, is no Zarr store."""
    if not Path(src).is_file():
        return "no Zarr store there (no files under it)"
    why = "is a file, not a Zarr store (a directory store, or a .zarr.zip)"
    if src.lower().endswith((".hdf5", ".h5")):
        return f"{why}; for an HDF5 file use `treadle import hdf5` (td.importers.hdf5)"
    return why


def _ranges(episodes: Sequence[str]) -> list[Sequence[str]]:
    """``episodes`` in runs of :data:`EPISODES_PER_TASK`: one executor task each."""
    return [episodes[i : i + EPISODES_PER_TASK] for i in range(0, len(episodes), EPISODES_PER_TASK)]


def _in_units(units: Sequence[int], count: int) -> Iterator[int]:
    """The episode indices of ``units`` (see :func:`_ranges`), in order."""
    for u in units:
        yield from range(u * EPISODES_PER_TASK, min(count, (u + 1) * EPISODES_PER_TASK))


class _open:
    """The store's root group, opened read-only (a context manager: closes a zip store)."""

    def __init__(
        self, source: Source, names: Sequence[str], settings: _Settings, copies: LocalCopies
    ):
        zarr = _zarr()
        where = source.describe(settings.zip_name or "")
        self._zip = None
        try:
            if settings.zip_name is not None:
                self._zip = zarr.storage.ZipStore(copies.path(settings.zip_name), mode="r")
                self.group = zarr.open_group(self._zip, mode="r")
            else:
                self.group = zarr.open_group(copies.tree(names), mode="r")
        except (FileNotFoundError, ValueError, OSError, KeyError) as e:
            self.close()
            raise CorruptData(
                f"{where} is not a readable Zarr group: {type(e).__name__}: {e}"
            ) from None

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()

    def __enter__(self) -> Any:
        return self.group

    def __exit__(self, *exc: object) -> None:
        self.close()


def _array(group: Any, path: str, where: str) -> Any:
    """``group[path]``; a codec that is not installed is :class:`MissingDependency`."""
    try:
        return group[path]
    except KeyError:
        raise CorruptData(f"{where}: no {path!r} in the store") from None
    except ValueError as e:
        raise _codec_error(e, f"{where}: array {path!r}") from None


def _codec_error(e: ValueError, where: str) -> Exception:
    """numcodecs' ``UnknownCodecError`` (a ``ValueError``) as :class:`MissingDependency`; an
    object codec (``pickle``, ``json2``, ``msgpack2``: Python objects, which zarr 3 does not
    read) is :class:`UnsafeInput`, not a codec to install."""
    found = re.search(r"'object_codec_id': '([^']*)'", str(e))
    if found:
        return UnsafeInput(
            f"{where} holds Python objects encoded with the {found.group(1)!r} object codec; "
            "refused (nothing is unpickled, a ReplayBuffer holds numbers)"
        )
    if "codec" in str(e).lower():
        return MissingDependency(
            f"{where} needs a codec that is not installed ({e}); JPEG XL (UMI) needs: "
            "pip install imagecodecs"
        )
    return CorruptData(f"{where} cannot be opened: {e}")


def _layout(group: Any, where: str) -> tuple[dict[str, Any], np.ndarray, dict[str, Any]]:
    """The ``data`` arrays (checked), ``episode_ends`` (checked) and the group's attributes."""
    import zarr

    data = _array(group, "data", where)
    if not isinstance(data, zarr.Group):
        raise CorruptData(f"{where}: 'data' is not a group")
    try:
        keys = sorted(data.array_keys())  # opens each array's metadata
    except ValueError as e:
        raise _codec_error(e, f"{where}: an array of 'data'") from None
    arrays = {k: _array(data, k, where) for k in keys}
    if not arrays:
        raise CorruptData(f"{where}: group 'data' holds no arrays")
    lengths = {k: (a.shape[0] if a.ndim else None) for k, a in arrays.items()}
    n = lengths[next(iter(arrays))]
    for k, a in arrays.items():
        if a.dtype.kind not in "biuf":
            raise SchemaMismatch(f"{where}: array data/{k} is {a.dtype}, not numeric")
        if 0 in a.shape[1:]:
            raise SchemaMismatch(f"{where}: array data/{k} is {a.shape}: no values per moment")
        if lengths[k] != n:
            raise CorruptData(f"{where}: arrays of different lengths: {lengths}")
    ends_arr = _array(group, "meta/episode_ends", where)
    if ends_arr.ndim != 1 or ends_arr.dtype.kind not in "iu" or ends_arr.shape[0] > MAX_EPISODES:
        raise CorruptData(
            f"{where}: meta/episode_ends is {ends_arr.shape} {ends_arr.dtype}, not a list of "
            f"at most {MAX_EPISODES} integers"
        )
    if isinstance(group.store, zarr.storage.ZipStore):
        check_zip_members(str(group.store.path), [*arrays.values(), ends_arr], where)
    at = f"{where}: meta/episode_ends"
    if read_cost(ends_arr, 0, ends_arr.shape[0]) > 8 * MAX_EPISODES:
        raise CorruptData(f"{at} is {describe_chunks(ends_arr)}: chunks too large to read")
    ends = np.asarray(read_rows(ends_arr, 0, ends_arr.shape[0], at), dtype=np.int64)
    if ends.size == 0 or ends[0] <= 0 or np.any(np.diff(ends) <= 0):
        raise CorruptData(
            f"{where}: meta/episode_ends is not strictly increasing from > 0: {ends[:8]}"
        )
    if ends[-1] != n:
        raise CorruptData(
            f"{where}: meta/episode_ends ends at {int(ends[-1])}, the data has {n} rows"
        )
    return arrays, ends, _attrs(group)


def _attrs(group: Any) -> dict[str, Any]:
    return {str(k): v for k, v in dict(group.attrs).items()}


def _episodes(
    source: Source,
    names: Sequence[str],
    settings: _Settings,
    episodes: Sequence[str],
    units: Sequence[int],
    copies: LocalCopies,
    report: Reports | None,
) -> Iterator[Episode]:
    """The episodes of ``units`` (ranges of :data:`EPISODES_PER_TASK` episodes), one slice
    of every array each."""
    with _open(source, names, settings, copies) as group:
        where = source.describe(settings.zip_name or "")
        arrays, ends, _ = _layout(group, where)
        starts = np.concatenate([[0], ends[:-1]])
        for i in _in_units(units, len(episodes)):
            yield _episode(
                arrays, int(starts[i]), int(ends[i]), episodes[i], where, settings, report
            )


def _episode(
    arrays: dict[str, Any],
    start: int,
    end: int,
    episode: str,
    where: str,
    settings: _Settings,
    report: Reports | None,
) -> Episode:
    at = f"{where}, {episode} (rows {start}..{end - 1})"
    per_row = ROW_BYTES + sum(math.prod(a.shape[1:]) * a.dtype.itemsize for a in arrays.values())
    costs = {k: read_cost(a, start, end) for k, a in arrays.items()}
    total = ROW_BYTES * (end - start) + sum(costs.values())
    if total > settings.max_episode_bytes:
        worst = max(costs, key=costs.__getitem__)
        raise CorruptData(
            f"{at}: {total} bytes, over max_episode_bytes ({settings.max_episode_bytes}); "
            f"data/{worst} ({describe_chunks(arrays[worst])}) takes {costs[worst]}"
        )
    cols: dict[str, Any] = {}
    for key, arr in arrays.items():
        name = column_name(key, at, settings.rename)
        values = read_rows(arr, start, end, f"{at}: array data/{key}")
        if is_camera(arr.shape, arr.dtype):
            values = camera_value(
                values, settings.images, settings.fps or 30.0, episode, name, report
            )
        cols[name] = values
    return episode, cols, end - start, per_row * (end - start)
