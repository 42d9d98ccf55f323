"""Fixtures for the import tests, written with each format's own writer.

- WebDataset: ``webdataset.ShardWriter``; MDS: ``streaming.MDSWriter``; Hugging Face:
  ``datasets.Dataset.save_to_disk``.
- LeRobot: its writer (lerobot 0.4.4) needs torchcodec/CUDA torchvision to read back and
  is not installed here, so datasets are written from LeRobot's documented on-disk layout
  (``src/lerobot/datasets/utils.py``: ``meta/info.json``, ``meta/episodes/...parquet``,
  ``meta/tasks.parquet``, ``data/chunk-*/file-*.parquet``, ``videos/<key>/chunk-*/file-*.mp4``
  for v3.0; ``meta/episodes.jsonl``, ``data/chunk-000/episode_*.parquet``,
  ``videos/chunk-000/<key>/episode_*.mp4`` for v2.1) with real H.264 MP4s made by PyAV.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

_TV_DONE = False


def import_streaming() -> Any:
    """``import streaming`` on CPU torch.

    PyPI's torchvision is a CUDA build whose ops are missing on CPU torch; defining the two
    op schemas it registers first (``nms``, ``qnms``) lets ``import torchvision`` (and so
    ``import streaming``) succeed. Test-only workaround, never in the library.
    """
    define_torchvision_ops()
    import streaming

    cls = streaming.StreamingDataset
    if not getattr(cls.__init__, "_counted", False):  # note each dataset's prefix: cleaned
        init = cls.__init__

        def counted(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            STREAMING_PREFIXES.append(self._shm_prefix_int)

        counted._counted = True  # type: ignore[attr-defined]
        cls.__init__ = counted
    return streaming


STREAMING_PREFIXES: list[int] = []
"""The shared-memory prefixes of the ``StreamingDataset`` objects this process made."""


def clean_streaming() -> list[str]:
    """Remove what this process's ``StreamingDataset`` objects leave on the machine: their
    shared memory (``/dev/shm/<prefix>_<name>``) and file locks (``/tmp/<prefix>_*_filelock``),
    by their prefixes only (``streaming``'s ``clean_stale_shared_memory`` removes every
    prefix's, other live processes' too). Returns what it removed."""
    import tempfile
    from multiprocessing.shared_memory import SharedMemory

    from streaming.base.constant import BARRIER_FILELOCK, CACHE_FILELOCK, SHM_TO_CLEAN
    from streaming.base.shared.prefix import _get_path

    removed = []
    for prefix in sorted(set(STREAMING_PREFIXES)):
        for name in (_get_path(prefix, n) for n in SHM_TO_CLEAN):
            try:
                shm = SharedMemory(name)
            except FileNotFoundError:
                continue
            shm.close()
            shm.unlink()  # its creator's atexit unlink then finds none: streaming ignores that
            removed.append(f"/dev/shm/{name}")
        for lock in (BARRIER_FILELOCK, CACHE_FILELOCK):
            path = Path(tempfile.gettempdir(), _get_path(prefix, lock))
            if path.exists():
                path.unlink()
                removed.append(str(path))
    STREAMING_PREFIXES.clear()
    return removed


def define_torchvision_ops() -> None:
    """Define torchvision's two op schemas (``nms``, ``qnms``) on CPU torch, once, so that
    ``import torchvision`` succeeds (``import streaming``, ``import lightning``, LeRobot's
    processors import it). Test-only workaround."""
    global _TV_DONE
    import torch

    if not _TV_DONE:
        try:
            lib = torch.library.Library("torchvision", "FRAGMENT")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            define_torchvision_ops._lib = lib  # keep it alive
        except RuntimeError:
            pass  # already defined (a real torchvision build, or a second call)
        _TV_DONE = True


TORCHVISION_PAGES = {"from-lerobot.md", "training-lightning.md"}
"""Guide pages whose examples import torchvision (LeRobot's processors, Lightning)."""


def set_up_page(page: str) -> None:
    """What the examples of a docs page need on CPU torch, for every test module that runs
    them (each sets up its own: a module run alone must pass): ``import streaming`` for
    ``from-mosaicml.md``, torchvision's op schemas for :data:`TORCHVISION_PAGES`."""
    if page == "from-mosaicml.md":
        import_streaming()
    elif page in TORCHVISION_PAGES:
        define_torchvision_ops()


def png_bytes(a: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(a).save(out, format="PNG")
    return out.getvalue()


def jpeg_bytes(a: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(a).save(out, format="JPEG")
    return out.getvalue()


# -- WebDataset ---------------------------------------------------------------------------------


def make_wds(folder: Path, n: int = 60, per_shard: int = 25, seed: int = 0, size: int = 16) -> str:
    """Shards ``shard-000000.tar ...`` with jpg/png/cls/json/npy/txt members; returns a brace pattern."""
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as w:
        for i in range(n):
            img = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
            w.write(
                {
                    "__key__": f"sample{i:05d}",
                    "png": png_bytes(img),
                    "cls": i % 10,
                    "json": {"id": i, "score": float(i) / 7, "tags": ["a", "b"][: 1 + i % 2]},
                    "npy": rng.random(7).astype(np.float32),
                    "txt": f"caption {i}",
                }
            )
    count = (n + per_shard - 1) // per_shard
    return str(folder / f"shard-{{000000..{count - 1:06d}}}.tar")


# -- MDS ------------------------------------------------------------------------------------------

MDS_COLUMNS = {
    "image": "png",
    "photo": "jpeg",
    "raw": "pil",
    "action": "ndarray:float32:7",
    "state": "ndarray",
    "label": "int",
    "small": "uint8",
    "score": "float32",
    "name": "str",
    "count": "str_int",
    "meta": "json",
    "blob": "bytes",
}


def make_mds(
    folder: Path,
    n: int = 80,
    compression: str | None = "zstd",
    seed: int = 0,
    size_limit: int = 1 << 15,
) -> str:
    """An MDS dataset written by ``streaming.MDSWriter``; returns its folder."""
    from PIL import Image

    streaming = import_streaming()
    rng = np.random.default_rng(seed)
    with streaming.MDSWriter(
        out=str(folder), columns=MDS_COLUMNS, compression=compression, size_limit=size_limit
    ) as w:
        for i in range(n):
            a = rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)
            w.write(
                {
                    "image": Image.fromarray(a),
                    "photo": Image.fromarray(a),
                    "raw": Image.fromarray(a),
                    "action": rng.random(7).astype(np.float32),
                    "state": rng.random((2, 3)),
                    "label": i,
                    "small": i % 256,
                    "score": float(i) / 3,
                    "name": f"item-{i}",
                    "count": i * 11,
                    "meta": {"i": i, "odd": bool(i % 2)},
                    "blob": bytes([i % 256]) * (1 + i % 5),
                }
            )
    return str(folder)


# -- Hugging Face ---------------------------------------------------------------------------------


def make_hf(folder: Path, n: int = 40, seed: int = 0, shard_size: str = "4KB") -> str:
    """A ``datasets.Dataset`` with Image/ClassLabel/Sequence/string columns, saved to disk."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(seed)
    feats = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=["cat", "dog", "bird"]),
            "action": datasets.Sequence(datasets.Value("float32"), length=4),
            "text": datasets.Value("string"),
            "score": datasets.Value("float64"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "image": [
                Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for _ in range(n)
            ],
            "label": [i % 3 for i in range(n)],
            "action": rng.random((n, 4)).astype(np.float32).tolist(),
            "text": [f"row {i}" for i in range(n)],
            "score": rng.random(n).tolist(),
        },
        features=feats,
    )
    ds.save_to_disk(str(folder), max_shard_size=shard_size)
    return str(folder)


# -- LeRobot ----------------------------------------------------------------------------------------


def encode_mp4(
    path: Path,
    frames: np.ndarray,
    fps: int,
    gop: int = 10,
    codec: str = "libx264",
    keyframes: tuple[int, ...] = (),
    options: dict[str, str] | None = None,
) -> None:
    """MP4 of ``frames`` (THWC uint8) with PyAV; pts = frame number at ``1/fps``.

    ``codec="libsvtav1"`` writes AV1 with ``g=2``, as LeRobot does by default.
    ``keyframes`` forces IDR frames there (LeRobot v3.0 files are episode files
    concatenated without re-encoding, so every episode starts on one).
    ``options`` replaces the encoder options (e.g. B-frames and open GOPs, as another
    tool's encode of one continuous recording would have).
    """
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height = frames.shape[2], frames.shape[1]
        s.pix_fmt = "yuv420p"
        if codec == "libsvtav1":
            s.options = {"g": "2", "preset": "12", "crf": "30"}
        else:
            s.options = {"g": str(gop), "bf": "0", "crf": "18", "forced-idr": "1"}
        if options is not None:
            s.options = options
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            if options is not None:
                # PyAV's own conversion inside encode() was seen to vary from run to run
                # (frame types too); converting here first makes the encode repeatable.
                vf = vf.reformat(format="yuv420p", threads=1)
            if i in keyframes:
                vf.pict_type = av.video.frame.PictureType.I
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def continuous_x264(open_gop: bool = True) -> dict[str, str]:
    """x264 options of one continuous recording encoded by another tool (not LeRobot).

    B-frames (3, pyramid) and a keyframe every 60 frames; with ``open_gop`` the keyframes
    are non-IDR I frames, some with leading B-frames that reference the GOP before.
    One encoder thread, so the frame types (which the tests rely on) are repeatable.
    """
    gop = "open-gop=1" if open_gop else "open-gop=0"
    return {
        "g": "60",
        "bf": "3",
        "crf": "18",
        "x264-params": f"{gop}:keyint=60:min-keyint=60:scenecut=0:threads=1",
    }


def decode_mp4(path: Path) -> np.ndarray:
    """Every frame of an MP4 as rgb24, in display order (PyAV)."""
    import av

    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def _frames(rng: np.random.Generator, n: int, h: int = 32, w: int = 32) -> np.ndarray:
    base = rng.integers(0, 255, (1, h, w, 3), dtype=np.uint8)
    drift = (np.arange(n, dtype=np.int32)[:, None, None, None] * 5) % 255
    return ((base.astype(np.int32) + drift) % 255).astype(np.uint8)


def _features(cams: list[str], h: int, w: int, fps: int, codec: str = "h264") -> dict[str, Any]:
    feats: dict[str, Any] = {
        "observation.state": {"dtype": "float32", "shape": [6], "names": None},
        "action": {"dtype": "float32", "shape": [6], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    for cam in cams:
        feats[cam] = {
            "dtype": "video",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
            "info": {"video.fps": fps, "video.codec": codec, "video.pix_fmt": "yuv420p"},
        }
    return feats


def _episode_table(ep: int, n: int, start: int, fps: int, rng: np.random.Generator) -> pa.Table:
    return pa.table(
        {
            "observation.state": pa.array(
                rng.random((n, 6)).astype(np.float32).tolist(), pa.list_(pa.float32())
            ),
            "action": pa.array(
                rng.random((n, 6)).astype(np.float32).tolist(), pa.list_(pa.float32())
            ),
            "timestamp": pa.array((np.arange(n) / fps).astype(np.float32)),
            "frame_index": pa.array(np.arange(n, dtype=np.int64)),
            "episode_index": pa.array(np.full(n, ep, dtype=np.int64)),
            "index": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "task_index": pa.array(np.full(n, ep % 2, dtype=np.int64)),
        }
    )


def make_lerobot_v3(
    root: Path,
    lengths: tuple[int, ...] = (12, 9, 15),
    fps: int = 10,
    cams: tuple[str, ...] = ("observation.images.top",),
    seed: int = 0,
    codec: str = "libx264",
    size: int = 32,
    episode_keyframes: bool = False,
    video_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A LeRobot v3.0 dataset: all episodes in one data file and one MP4 per camera.

    ``episode_keyframes`` starts every episode on a keyframe, as LeRobot's own writer does
    (it concatenates per-episode files); without it episodes start mid-GOP.
    ``video_options``: encoder options of the shared MP4 (see :func:`encode_mp4`).

    Returns what was written: ``{"tables": [per-episode pa.Table], "frames": {cam: [THWC]}}``.
    """
    rng = np.random.default_rng(seed)
    h = w = size
    tasks = ["pick the cube", "place the cube"]
    tables, frames = [], {c: [] for c in cams}
    start = 0
    ep_rows = []
    for ep, n in enumerate(lengths):
        t = _episode_table(ep, n, start, fps, rng)
        tables.append(t)
        row: dict[str, Any] = {
            "episode_index": ep,
            "tasks": [tasks[ep % 2]],
            "length": n,
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": start,
            "dataset_to_index": start + n,
            "meta/episodes/chunk_index": 0,
            "meta/episodes/file_index": 0,
        }
        t0 = start / fps
        for cam in cams:
            frames[cam].append(_frames(rng, n, h, w))
            row[f"videos/{cam}/chunk_index"] = 0
            row[f"videos/{cam}/file_index"] = 0
            row[f"videos/{cam}/from_timestamp"] = t0
            row[f"videos/{cam}/to_timestamp"] = t0 + n / fps
        ep_rows.append(row)
        start += n
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
    (root / "data" / "chunk-000").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.concat_tables(tables), root / "data/chunk-000/file-000.parquet")
    pq.write_table(pa.Table.from_pylist(ep_rows), root / "meta/episodes/chunk-000/file-000.parquet")
    pq.write_table(
        pa.table({"task_index": [0, 1], "__index_level_0__": tasks}), root / "meta/tasks.parquet"
    )
    for cam in cams:
        encode_mp4(
            root / f"videos/{cam}/chunk-000/file-000.mp4",
            np.concatenate(frames[cam]),
            fps,
            codec=codec,
            keyframes=tuple(np.cumsum((0,) + lengths[:-1]).tolist()) if episode_keyframes else (),
            options=video_options,
        )
    info = {
        "codebase_version": "v3.0",
        "robot_type": "test",
        "total_episodes": len(lengths),
        "total_frames": start,
        "total_tasks": 2,
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": fps,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": _features(list(cams), h, w, fps, "av1" if "av1" in codec else "h264"),
    }
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    return {"tables": tables, "frames": frames, "tasks": tasks, "fps": fps}


def make_lerobot_v21(
    root: Path,
    lengths: tuple[int, ...] = (10, 7),
    fps: int = 10,
    cams: tuple[str, ...] = ("observation.images.wrist",),
    seed: int = 1,
    codec: str = "libx264",
    size: int = 32,
) -> dict[str, Any]:
    """A LeRobot v2.1 dataset: one parquet and one MP4 per episode (and camera)."""
    rng = np.random.default_rng(seed)
    h = w = size
    tasks = ["pick", "place"]
    tables, frames = [], {c: [] for c in cams}
    start = 0
    eps = []
    for ep, n in enumerate(lengths):
        t = _episode_table(ep, n, start, fps, rng)
        tables.append(t)
        (root / "data/chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(t, root / f"data/chunk-000/episode_{ep:06d}.parquet")
        for cam in cams:
            f = _frames(rng, n, h, w)
            frames[cam].append(f)
            encode_mp4(root / f"videos/chunk-000/{cam}/episode_{ep:06d}.mp4", f, fps, codec=codec)
        eps.append({"episode_index": ep, "tasks": [tasks[ep % 2]], "length": n})
        start += n
    (root / "meta").mkdir(parents=True, exist_ok=True)
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    (root / "meta/tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(tasks))
    )
    info = {
        "codebase_version": "v2.1",
        "robot_type": "test",
        "total_episodes": len(lengths),
        "total_frames": start,
        "total_tasks": 2,
        "total_videos": len(lengths) * len(cams),
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": fps,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        "features": _features(list(cams), h, w, fps, "av1" if "av1" in codec else "h264"),
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=2))
    return {"tables": tables, "frames": frames, "tasks": tasks, "fps": fps}


# -- faithful values and hostile input (WebDataset / MDS) -----------------------------------------


def make_wds_json_drift(folder: Path, drift: str, n: int = 1200, at: int = 1100) -> str:
    """One shard by ``webdataset.TarWriter``; sample ``at``'s JSON differs from all before it.

    ``drift``: ``"float"`` (``score`` 1100.5 where earlier scores are ints), ``"key"``
    (a key ``late`` no earlier sample had), ``"null"`` (``note``, null in every earlier
    sample, holds a string), ``"int"`` (``score`` an int where earlier scores are floats:
    widened exactly).
    """
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"drift-{drift}.tar"
    with wds.TarWriter(str(path)) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:05d}", "json": _drift_meta(i, at, drift), "cls": i % 3})
    return str(path)


def make_mds_json_drift(folder: Path, drift: str, n: int = 1200, at: int = 1100) -> str:
    """The same JSON drift as :func:`make_wds_json_drift`, in a ``json`` column by ``MDSWriter``."""
    streaming = import_streaming()
    with streaming.MDSWriter(out=str(folder), columns={"meta": "json", "i": "int"}) as w:
        for i in range(n):
            w.write({"meta": _drift_meta(i, at, drift), "i": i})
    return str(folder)


def _drift_meta(i: int, at: int, drift: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": i, "score": i if drift != "int" else i + 0.25, "note": None}
    if i == at:
        if drift == "float":
            meta["score"] = i + 0.5
        elif drift == "key":
            meta["late"] = "only here"
        elif drift == "null":
            meta["note"] = "the first non-null"
        else:
            meta["score"] = i
    return meta


_MIB_OF_ZEROS = bytes(1 << 20)


def write_zeros(f: Any, n: int) -> None:
    """Write ``n`` zero bytes to ``f`` a MiB at a time (a bomb is never held in memory)."""
    for _ in range(n >> 20):
        f.write(_MIB_OF_ZEROS)
    f.write(_MIB_OF_ZEROS[: n & ((1 << 20) - 1)])


def tar_gz_bomb(path: Path, member_bytes: int, members: int = 1) -> str:
    """A ``.tar.gz`` of ``members`` all-zero members: tarfile's headers, streamed through gzip."""
    import gzip
    import tarfile

    with gzip.open(path, "wb", compresslevel=1) as g:
        for j in range(members):
            info = tarfile.TarInfo(f"bomb{j:05d}.bin")
            info.size = member_bytes
            g.write(info.tobuf())
            write_zeros(g, member_bytes + (-member_bytes % tarfile.BLOCKSIZE))
        g.write(bytes(2 * tarfile.BLOCKSIZE))  # the end-of-archive marker
    return str(path)


def mds_gz_bomb(folder: Path, raw_bytes: int, declare: int | None = None) -> str:
    """An MDS dataset whose one gz shard inflates to ``raw_bytes`` (one all-zero ``bytes`` sample).

    ``index.json`` comes from ``streaming.MDSWriter`` (gz, one ``blob`` column); the shard
    is then replaced by one streamed through gzip, and the index given its real sizes
    (``raw_data.bytes`` = ``declare`` when given: a lying index).
    """
    import gzip

    streaming = import_streaming()
    with streaming.MDSWriter(out=str(folder), columns={"blob": "bytes"}, compression="gz") as w:
        w.write({"blob": b"x"})
    index = json.loads((folder / "index.json").read_text())
    shard = index["shards"][0]
    zpath = folder / shard["zip_data"]["basename"]
    blob = raw_bytes - 16  # header: count, 2 offsets; sample: its blob's size, then the blob
    head = np.array([1, 12, raw_bytes, blob], np.uint32).tobytes()
    with gzip.open(zpath, "wb", compresslevel=1) as g:
        g.write(head)
        write_zeros(g, blob)
    shard["raw_data"]["bytes"] = raw_bytes if declare is None else declare
    shard["zip_data"]["bytes"] = zpath.stat().st_size
    (folder / "index.json").write_text(json.dumps(index))
    return str(folder)


_CAPPED = """
import json, resource, sys
sys.path.insert(0, {tests!r})
import treadle as td
from importer_fixtures import make_wds

def vm(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

# warm up first (thread pools, allocator arenas, Lance), then cap the address space
client = td.Client({root!r})
td.importers.webdataset(make_wds(__import__("pathlib").Path({warm!r}), n=4, per_shard=4),
                        client.project("p"), "warm", progress=False)
base = vm("VmRSS")
resource.setrlimit(resource.RLIMIT_AS, (vm("VmSize") + {headroom}, resource.RLIM_INFINITY))
try:
    {call}
    out = {{"error": None}}
except MemoryError:
    out = {{"error": "MemoryError"}}
except td.errors.TreadleError as e:
    out = {{"error": type(e).__name__, "message": str(e)}}
out["rss_growth"] = vm("VmHWM") - base
print(json.dumps(out))
"""


def run_memory_capped(
    call: str, root: str, tmp: Path, headroom: int = 512 << 20, timeout: float = 120
) -> dict[str, Any]:
    """Run ``call`` (Python, ``td`` and ``client`` in scope) in a subprocess whose address
    space may grow by at most ``headroom`` bytes; returns ``{"error", "message", "rss_growth"}``.
    """
    import subprocess
    import sys

    code = _CAPPED.format(
        tests=str(Path(__file__).parent),
        root=root,
        warm=str(tmp / "warm"),
        headroom=headroom,
        call=call,
    )
    env = dict(os.environ, MALLOC_ARENA_MAX="2")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=timeout, env=env
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


def nothing_committed(project) -> bool:
    """No table was committed to ``project`` (a failed first import may not create it)."""
    return not project.exists() or project.branch("main").tables() == []
