"""``td.importers.hdf5``: robomimic, LIBERO, MimicGen, RoboCasa and ALOHA HDF5 files -> a table.

One file (``.hdf5``, ``.h5``) or a folder of them, local or on an object store; each demo is
one episode (:mod:`~treadle.importers.hdf5.hdf5_layouts` says which layouts, and how a demo's
datasets become columns). Episodes of one file are ``demo_<n>`` in numeric order; from a
folder, ``<file stem>__demo_<n>`` (every LIBERO file has its own ``demo_0``), files in name
order; an ALOHA file is one episode named by its stem. Cameras (``uint8 [N, H, W, 3]``)
follow ``images`` (:mod:`treadle.importers.cameras`); every other dataset is stored exactly.
h5py is an optional extra: ``pip install 'treadle[hdf5]'``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import numpy as np

from treadle.errors import CorruptData, MissingDependency, SchemaMismatch
from treadle.importers.arrow import check_rename, column_name
from treadle.importers.cameras import Reports, camera_value, check_camera_mode, is_camera
from treadle.importers.episodic import (
    Episode,
    LocalCopies,
    SourceMeta,
    import_episodes,
    source_files,
)
from treadle.importers.hdf5.aloha_jpeg import LENGTHS, is_packed_camera, jpeg_frames
from treadle.importers.hdf5.hdf5_layouts import (
    SMALL_BYTES,
    Hdf5File,
    attrs,
    control_freq,
    datasets,
    demo_columns,
    demo_length,
    iter_demo_groups,
    open_h5,
    own,
    read_layout,
    read_whole,
    task_of,
)
from treadle.importers.images import decode_image
from treadle.importers.run import ImportOptions, ImportResult
from treadle.importers.sources import Source
from treadle.video.image_decode import image_header

if TYPE_CHECKING:
    from treadle.catalog.client import Project
    from treadle.importers.executor import Executor

SUFFIXES = (".hdf5", ".h5", ".he5", ".hdf")
INSTALL = "pip install 'treadle[hdf5]'"
#: the most bytes one demo's datasets may hold (each demo is read whole)
MAX_EPISODE_BYTES = 4 << 30


def require_h5py() -> None:
    try:
        import h5py  # noqa: F401
    except ImportError as e:
        raise MissingDependency(
            f"HDF5 imports need h5py ({e}); install it with: {INSTALL}"
        ) from None


@dataclass(frozen=True)
class _Settings:
    """What reading a demo needs (shipped to Ray tasks with the source)."""

    images: str
    fps: float | None
    next_obs: bool
    folder: bool
    max_episode_bytes: int
    rename: dict[str, str] | None


def import_hdf5(
    src: str,
    project: Project,
    table: str,
    *,
    images: str = "video",
    fps: float | None = None,
    next_obs: bool = False,
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
    """Import robomimic/LIBERO/ALOHA HDF5 demonstrations into ``table``; one commit.

    ``images``: ``"video"`` (H.264, PSNR in the result), ``"encoded"`` (lossless PNG per
    moment) or ``"decoded"`` (``uint8`` arrays). ``fps``: the demos' rate; by default
    robomimic's ``env_args`` ``control_freq``, and required for ``images="video"`` when the
    files have a camera and no rate. ``next_obs``: also import ``next_obs/*``. The ``data`` group's attributes
    become ``table.metadata`` (per file stem for a folder), ``mask/<key>`` filter keys
    ``table.episode_sets()``. ``executor=td.RayExecutor()`` reads each file in a Ray task.
    ``allow_pickle`` is accepted for a uniform CLI; nothing is unpickled.
    """
    check_camera_mode(images)
    check_fps(fps)
    require_h5py()
    # images="video" is not one of ImportOptions' modes: it is this importer's own option
    opts = ImportOptions.of({k: v for k, v in locals().items() if k != "images"})
    source, names, folder = source_files(src, opts.source_options, SUFFIXES, "HDF5")
    copies = LocalCopies(source)
    try:
        meta, fps, seen, cameras = _survey(source, names, folder, copies, fps, opts.rename)
        check_rename(opts.rename, seen, f"HDF5 source {source.describe()}")
        if cameras:  # a table of numbers needs no rate; a video does
            why = f"camera {cameras[0]!r}, and no env_args control_freq; pass fps= (--fps)"
            check_fps(fps, images, f"{source.describe(names[0])}: {why}")
        settings = _Settings(images, fps, next_obs, folder, int(max_episode_bytes), opts.rename)
        options = opts.id_options("rename", images=images, fps=fps, next_obs=next_obs)
        return import_episodes(
            opts,
            project,
            table,
            fmt="hdf5",
            source=source,
            names=names,
            episodes=partial(_episodes, source, names, settings),
            options=options,
            fps=fps,
            images=images,
            meta=meta,
            copies=copies,
        )
    finally:
        copies.close()


def check_fps(fps: float | None, images: str = "", why: str = "") -> None:
    """A positive ``fps`` or None; ``images="video"`` needs one (``why`` says why none)."""
    if fps is not None and not 0 < float(fps) < float("inf"):  # inf: no video, no seconds
        raise ValueError(f"fps must be a positive finite number, got {fps!r}")
    if images == "video" and fps is None:
        raise SchemaMismatch(f"images='video' needs fps= ({why})")


def _stem(name: str) -> str:
    return PurePosixPath(name).stem


def _episode_name(name: str, demo: str, info: Hdf5File, folder: bool) -> str:
    if info.layout == "aloha":
        return _stem(name)
    return f"{_stem(name)}__{demo}" if folder else demo


def _survey(
    source: Source,
    names: Sequence[str],
    folder: bool,
    copies: LocalCopies,
    fps: float | None,
    rename: dict[str, str] | None,
) -> tuple[SourceMeta, float | None, set[str], list[str]]:
    """Every file's layout, metadata and filter keys; the demos' rate; the column names;
    the camera datasets of the first demos (a rate is needed only for them)."""
    cameras: list[str] = []
    rates: dict[str, float | None] = {}
    metadata: dict[str, Any] = {}
    sets: dict[str, list[str]] = {}
    episodes: dict[str, str] = {}
    seen: set[str] = set()
    for name in names:
        where = source.describe(name)
        with open_h5(copies.path(name), where) as f:
            info = read_layout(f, where)
            if folder:
                metadata[_stem(name)] = info.metadata
            else:
                metadata = info.metadata
            rates[where] = control_freq(info.metadata)
            demos = {
                demo: _episode_name(name, demo, info, folder)
                for demo, _ in iter_demo_groups(f, info, where)
            }
            for ep in demos.values():
                if ep in episodes:
                    raise CorruptData(f"{where}: episode {ep!r} is also in {episodes[ep]}")
                episodes[ep] = where
            first = f[info.demos[0]]
            for p, ds in datasets(first, True):
                seen.add(p.replace("/", "_").replace(".", "_"))
                packed = info.compressed and is_packed_camera(p, ds.shape, ds.dtype)
                if packed or is_camera(ds.shape, ds.dtype):
                    cameras.append(p)
            for key, members in info.masks.items():
                missing = [m for m in members if m not in demos]
                if missing:
                    raise CorruptData(
                        f"{where}: filter key mask/{key} names {missing[0]!r}, not a demo"
                    )
                sets.setdefault(key, []).extend(demos[m] for m in members)
    return SourceMeta(metadata, sets, "hdf5"), _rate(fps, rates), seen, cameras


def _rate(fps: float | None, rates: dict[str, float | None]) -> float | None:
    """``fps`` when given, else the one ``control_freq`` the files name (two different
    ones are an error: one table has one rate, and the other files' would be wrong)."""
    named = {w: r for w, r in rates.items() if r is not None}
    if fps is not None or not named:
        return fps
    (w1, r1), *others = named.items()
    for w2, r2 in others:
        if r2 != r1:
            raise SchemaMismatch(
                f"{w1} names control_freq {r1:g} and {w2} {r2:g}: one table has one rate; "
                "import them into separate tables, or give fps= (--fps) if one is wrong"
            )
    return r1


def _episodes(
    source: Source,
    names: Sequence[str],
    settings: _Settings,
    files: Sequence[int],
    copies: LocalCopies,
    report: Reports | None,
) -> Iterator[Episode]:
    """The episodes of ``files``, one demo at a time."""
    require_h5py()
    for i in files:
        where = source.describe(names[i])
        with open_h5(copies.path(names[i]), where) as f:
            info = read_layout(f, where)
            task = task_of(info.metadata)
            for demo, group in iter_demo_groups(f, info, where):
                episode = _episode_name(names[i], demo, info, settings.folder)
                at = f"{where}, {demo}" if demo else where
                yield _demo(group, info, episode, at, task, settings, report)


def _demo(
    group: Any,
    info: Hdf5File,
    episode: str,
    where: str,
    task: str | None,
    settings: _Settings,
    report: Reports | None,
) -> Episode:
    """One demo as ``(episode, columns, rows, bytes)``."""
    n = demo_length(group, info.layout, where)
    if n < 1:
        raise CorruptData(f"{where} has no moments")
    limit = settings.max_episode_bytes
    columns = demo_columns(group, n, settings.next_obs, where, limit, info.compressed)
    cols: dict[str, Any] = {}
    nbytes = 0
    for c in columns:
        name = column_name(c.path.replace("/", "_"), where, settings.rename)
        if name in cols:
            raise SchemaMismatch(
                f"{where}: datasets {c.path!r} and another both become column {name!r}"
            )
        values = read_whole(c.dataset, f"{where}, dataset {c.path!r}")
        nbytes += c.nbytes
        if c.packed:
            values = _jpeg_camera(group, values, settings, episode, name, report, where)
        elif c.camera:
            values = camera_value(
                values, settings.images, settings.fps or 30.0, episode, name, report
            )
        cols[name] = values
    ep_meta = attrs(group, where).get("ep_meta")
    if isinstance(ep_meta, str) and "ep_meta" not in cols:
        cols["ep_meta"] = ep_meta
    if task is not None and "task" not in cols:
        cols["task"] = task
    return episode, cols, n, nbytes


def _jpeg_camera(
    group: Any,
    padded: Any,
    settings: _Settings,
    episode: str,
    name: str,
    report: Reports | None,
    where: str,
) -> Any:
    """One camera of a compressed ALOHA file: its JPEG bytes as they are (``"encoded"``),
    else decoded as any JPEG (Pillow: RGB, what LeRobot's converter gets from
    ``cv2.imdecode`` and ``COLOR_BGR2RGB``) and stored by ``images``."""
    lengths = own(group.get(LENGTHS), group.file, where, LENGTHS)
    at = f"{where}, camera {name!r}"
    if lengths is not None and lengths.size > 64 * padded.shape[0]:  # read whole: bounded
        raise CorruptData(f"{at}: /{LENGTHS} is {list(lengths.shape)}, for {len(padded)} frames")
    table = None if lengths is None else read_whole(lengths, f"{at}: /{LENGTHS}", SMALL_BYTES)
    jpegs = jpeg_frames(padded, table, at)
    nbytes = sum(len(b) for b in jpegs)
    if settings.images == "encoded":
        if report is not None:
            report.camera(name).add(nbytes, None, None)
        return jpegs
    _check_jpeg_sizes(jpegs, at, settings.max_episode_bytes)
    frames = np.stack([decode_image(b, "jpg", f"{at}, frame {i}") for i, b in enumerate(jpegs)])
    if frames.ndim != 4:  # grey JPEGs
        frames = np.repeat(frames[..., None], 3, axis=3)
    fps = settings.fps or 30.0
    return camera_value(frames, settings.images, fps, episode, name, report, nbytes)


def _check_jpeg_sizes(jpegs: list[bytes], at: str, limit: int) -> None:
    """One size for every frame, and their pixels within ``limit`` bytes, from the JPEG
    headers: a few hundred KB of JPEG may decode to 300 MB a frame."""
    sizes: dict[tuple[int, int], int] = {}
    for i, b in enumerate(jpegs):
        sizes.setdefault(image_header(b, f"{at}, frame {i}").size, i)
    if len(sizes) > 1:
        (a, i), (b, j) = list(sizes.items())[:2]
        raise CorruptData(f"{at}: frame {i} is {a[1]}x{a[0]}, frame {j} {b[1]}x{b[0]}")
    h, w = next(iter(sizes))
    if len(jpegs) * h * w * 3 > limit:
        raise CorruptData(
            f"{at}: {len(jpegs)} frames of {w}x{h} decode to {len(jpegs) * h * w * 3:,} bytes, "
            f"over max_episode_bytes ({limit:,})"
        )
