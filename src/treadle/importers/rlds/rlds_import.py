"""Import an RLDS dataset (a TFDS version folder of TFRecord shards) as a time-indexed table.

No TensorFlow: :mod:`~treadle.importers.rlds.tfds_folder` reads ``dataset_info.json`` and
``features.json``; :mod:`~treadle.importers.rlds.tfrecord` reads the shards record by
record (both CRC-32C checksums checked); :mod:`~treadle.importers.rlds.example_proto`
parses each record, one ``tf.train.Example`` per episode, with Google's ``protobuf``;
:mod:`~treadle.importers.rlds.rlds_steps` maps it to one ``append_episode``. Those two
packages (``protobuf``, ``google-crc32c``) are the ``treadle[rlds]`` extra.

Episodes are numbered over the split's shards in file order and the records in order:
episode ``i`` is ``episode_{i:06d}``, its number computed from ``dataset_info.json``'s
shard lengths, so one Ray task per shard (``executor=td.RayExecutor()``) names its own
episodes; a shard whose record count differs from its declared length is refused. Each
step is a moment (``frame`` = step index); ``fps`` sets the table's fps (RLDS stores none)
and is required with ``images="video"``. Memory stays bounded: a shard is streamed one
record (one episode) at a time, a few episodes decoded ahead.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from treadle.errors import CorruptData, NotFound
from treadle.importers.camera_video import CameraReport
from treadle.importers.executor import Executor, pick
from treadle.importers.rlds.example_proto import example_class, parse_example
from treadle.importers.rlds.rlds_steps import StepsMapping
from treadle.importers.rlds.tfds_folder import RldsFolder, Shard, read_folder
from treadle.importers.rlds.tfrecord import MAX_RECORD_BYTES, iter_records
from treadle.importers.run import ImportOptions, ImportResult, Progress, import_id, run_import
from treadle.importers.sources import Source, SourceFile, identities
from treadle.read.prefetch import default_threads, ordered_map, prefetch
from treadle.video.values import check_fps

if TYPE_CHECKING:
    from treadle.catalog.client import Project

IMAGES = ("video", "encoded", "decoded")


def episode_name(i: int) -> str:
    """The name of the split's episode ``i`` (over the shards in file order)."""
    return f"episode_{i:06d}"


def iter_episodes(
    source: Source,
    folder: RldsFolder,
    shards: Sequence[Shard],
    mapping: StepsMapping,
    fps: float | None,
    *,
    max_record_bytes: int = MAX_RECORD_BYTES,
    threads: int | None = None,
) -> Iterator[tuple[str, dict[str, Any], dict[str, Any], int, int]]:
    """``(episode name, columns, cameras, steps, record bytes)`` per record of ``shards``, in
    order.

    An episode with no steps has no columns (a table has no moment to hold it). Decoding (and
    video encoding) of the next episodes runs on a thread pool while earlier ones are written.
    """

    def records() -> Iterator[tuple[int, str, bytes]]:
        for shard in shards:
            where = source.describe(shard.name)
            n = 0
            for n, data in enumerate(_shard_records(source, shard, max_record_bytes), 1):
                yield shard.first + n - 1, f"{where}, record {n - 1}", data
            if n != shard.episodes:
                raise CorruptData(
                    f"{where} holds {n} records; dataset_info.json says {shard.episodes}"
                )

    def build(item: tuple[int, str, bytes]) -> tuple[str, dict, dict, int, int]:
        i, where, data = item
        at = f"{where} (episode {i}, {episode_name(i)})"
        cols, cams, steps = mapping.episode(parse_example(data, at), at, fps)
        return episode_name(i), cols, cams, steps, len(data) + 16

    threads = threads or min(2, default_threads())
    yield from ordered_map(build, records(), threads, ahead=threads, leave_running=True)


def _shard_records(source: Source, shard: Shard, max_record_bytes: int) -> Iterator[bytes]:
    where = source.describe(shard.name)
    try:
        size = source.size(shard.name)
    except NotFound:
        raise NotFound(f"RLDS shard {where} is missing") from None
    with source.open(shard.name) as f:
        yield from iter_records(f, size, where, max_record_bytes)  # type: ignore[arg-type]


def import_rlds(
    src: str,
    project: Project,
    table: str,
    *,
    split: str = "train",
    images: str = "video",
    fps: float | None = None,
    pixels: str = "pillow",
    branch: str | None = None,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    client: Any = None,
    root: str | None = None,
    progress: bool | None = None,
    allow_pickle: bool = False,
    rename: dict[str, str] | None = None,
    max_record_bytes: int = MAX_RECORD_BYTES,
    executor: Executor | None = None,
) -> ImportResult:
    """Import one split of an RLDS dataset (a TFDS version folder or URL) into ``table``.

    Args:
        src: the TFDS dataset version folder (``.../bridge/1.0.0``: ``dataset_info.json``,
            ``features.json``, ``<name>-<split>.tfrecord-NNNNN-of-MMMMM``), local or an
            object-store URL (``source_options`` for its credentials).
        split: the split to import (``NotFound`` names the ones there are).
        images: ``"video"`` (one H.264 stream per episode and camera; the result's
            ``cameras`` reports bytes and PSNR), ``"encoded"`` (the source JPEG/PNG bytes,
            unchanged) or ``"decoded"`` (``uint8 [H, W, 3]``, Pillow's decode).
        fps: the table's frame rate; required with ``images="video"``.
        pixels: whose JPEG decode the ``decoded`` / ``video`` frames are: ``"pillow"``
            (accurate IDCT, as ``tf.io.decode_jpeg(dct_method="INTEGER_ACCURATE")``) or
            ``"tfds"`` (TF's default fast IDCT: the pixels TFDS and ``tf.data`` pipelines
            give; :mod:`~treadle.importers.rlds.tf_pixels`).
        rename: column (``observation_image``, or its path ``observation/image``) -> column.
        max_record_bytes: the largest record (one episode) read, each held whole; also the
            most bytes its episode-level values make once copied onto every step.
        executor: ``td.RayExecutor()`` runs one Ray task per shard and commits once here.

    The other options are those every importer takes (:func:`treadle.importers.webdataset`).
    ``allow_pickle`` is accepted for a uniform CLI; RLDS data is never unpickled.
    """
    if images not in IMAGES:
        raise ValueError(f"images must be one of {IMAGES}, got {images!r}")
    if images == "video" and fps is None:
        raise ValueError(
            "images='video' needs fps= (RLDS stores no frame rate, and a video needs one); "
            "pass the dataset's control rate, or images='encoded'"
        )
    if pixels not in ("pillow", "tfds") or (pixels == "tfds" and images == "encoded"):
        raise ValueError(
            f"pixels must be 'pillow' or 'tfds' (with images 'decoded' or 'video': encoded "
            f"images are decoded by the loader, with Pillow), got {pixels!r} with {images!r}"
        )
    fps = None if fps is None else check_fps(fps)
    opts = ImportOptions.of({**locals(), "images": "encoded"})  # the shared check knows 2
    return _import(src, project, table, opts, (split, images, fps, max_record_bytes, pixels))


def _camera_reports(mapping: StepsMapping, images: str) -> dict[str, CameraReport]:
    """An empty :class:`CameraReport` per camera feature, saying what it is stored as."""
    return {
        k: CameraReport(
            c.column,
            stored_as="video" if c.video else ("decoded" if images == "decoded" else "encoded"),
            why=mapping.why_kept(k),
        )
        for k, c in mapping.cameras.items()
    }


def _import(
    src: str, project: Project, table: str, opts: ImportOptions, own: tuple[Any, ...]
) -> ImportResult:
    split, images, fps, max_record_bytes, pixels = own
    example_class()  # protobuf is there (MissingDependency says how to install it)
    source = Source(str(src).rstrip("/"), opts.source_options)
    folder = read_folder(source, split)
    mapping = StepsMapping(folder, images, opts.rename, pixels, max_record_bytes)
    br = opts.open_branch(project)
    names = ["dataset_info.json", "features.json"] + [s.name for s in folder.shards]
    ids = identities([SourceFile(source, n) for n in names])
    missing = [n for n, i in zip(names, ids) if i is None]
    if missing:
        raise NotFound(f"RLDS shard {source.describe(missing[0])} is missing")
    sizes = [i[0] for i in ids[2:] if i is not None]
    reports = _camera_reports(mapping, images)

    def write(tw: Any, bar: Progress, only: Sequence[int] | None = None) -> tuple[int, int, int]:
        rows = eps = nbytes = 0
        shards = pick(folder.shards, only)
        episodes = iter_episodes(
            source, folder, shards, mapping, fps, max_record_bytes=max_record_bytes
        )
        for name, cols, cams, steps, n in prefetch(episodes, depth=1):
            nbytes += n
            bar.update(n)
            if steps == 0:
                warnings.warn(f"RLDS {folder.name}: {name} has no steps; skipped", stacklevel=2)
                continue
            for key, (source_bytes, stream, frame_psnr) in cams.items():
                reports[key].add(source_bytes, stream, frame_psnr)
            tw.append_episode(cols, episode=name, fps=fps)
            rows += steps
            eps += 1
        return rows, eps, nbytes

    options = opts.id_options("rename", images=images, split=split, fps=fps)
    if pixels != "pillow":  # absent by default: ids of imports made before it are unchanged
        options["pixels"] = pixels
    result = run_import(
        opts,
        br,
        table,
        fmt="rlds",
        iid=import_id("rlds", [source.describe(n) for n in names], ids, options),
        what=f"{folder.name} split {split} from {source.root} ({folder.num_episodes} episodes)",
        write=write,
        total=sum(sizes),
        unit="B",
        sources=[source.describe(s.name) for s in folder.shards],
    )
    if opts.executor is None and not result.skipped:
        result = replace(result, cameras=[r.as_dict() for r in reports.values()])
    return result
