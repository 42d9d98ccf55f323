"""Case 2, peer rows: the same video windows read by torchcodec, SPDL and LeRobotDataset.

- torchcodec (CPU build, system FFmpeg) and SPDL decode **the same bytes** as treadle:
  treadle's Annex-B streams remuxed (no re-encode) into MP4 once, because both seek in a
  container. Each window is the one treadle's plan picked (same episode, same first frame,
  same length), decoded to RGB uint8 ``[T, H, W, 3]``; with 2 threads, windows go to a pool of
  2. Before timing, the first windows are checked equal to treadle's frames.
- LeRobotDataset (v3 layout) is written by LeRobot's own writer from the same frames (its
  default AV1 ``g=2``, and H.264 with the GOP of treadle's streams), and read as LeRobot users
  do: ``delta_timestamps`` for the window through a ``DataLoader`` (workers 0 and 2), items at
  the same first frames. Its bytes differ (its own encode), so its frames are not compared.

A peer that is not installed gets the status "not installed" and no numbers.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

Window = tuple[int, int, int]  # (episode, first frame, frames)


def status(name: str) -> tuple[str, str]:
    """("ok" or "not installed", why) for ``torchcodec``, ``spdl`` or ``lerobot``."""
    try:
        if name == "lerobot":
            define_torchvision_ops()
            import lerobot.datasets.lerobot_dataset  # noqa: F401
        elif name == "spdl":
            import spdl.io  # noqa: F401
        else:
            import torchcodec.decoders  # noqa: F401
    except Exception as e:  # ImportError, or a native library that does not load
        return "not installed", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return "ok", ""


@functools.cache
def define_torchvision_ops() -> None:
    """Define the two operator schemas torchvision's import registers fakes for.

    torchvision's compiled ops do not load against the local CPU torch build; its Python
    part (all LeRobot uses) imports once ``torchvision::nms`` and ``::qnms`` exist.
    """
    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "DEF")  # kept alive by the cache
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    define_torchvision_ops.lib = lib


# -- the same bytes in a container ------------------------------------------------------------


def remux_mp4(h264: Path, mp4: Path, fps: int) -> None:
    """Copy the packets of an Annex-B stream into MP4, frame ``i`` at ``pts = i``."""
    with av.open(str(h264), format="h264") as src, av.open(str(mp4), "w", format="mp4") as dst:
        s = src.streams.video[0]
        out = dst.add_stream_from_template(s)
        out.time_base = Fraction(1, fps)
        for i, pkt in enumerate(p for p in src.demux(s) if p.size):
            pkt.stream = out
            pkt.pts = pkt.dts = i
            pkt.time_base = Fraction(1, fps)
            pkt.duration = 1
            dst.mux(pkt)


def mp4_streams(root: Path, paths: list[str], fps: int) -> list[Path]:
    """MP4 copies of treadle's streams (made once, beside the bench data)."""
    out = []
    for p in paths:
        mp4 = root / "mp4" / (Path(p).stem + ".mp4")
        if not mp4.exists():
            mp4.parent.mkdir(parents=True, exist_ok=True)
            tmp = mp4.with_suffix(".tmp.mp4")
            remux_mp4(Path(p), tmp, fps)
            tmp.rename(mp4)
        out.append(mp4)
    return out


# -- torchcodec and SPDL ----------------------------------------------------------------------


class TorchcodecWindows:
    """Windows from MP4 files with torchcodec's ``VideoDecoder`` (one per file and thread)."""

    def __init__(self, files: list[Path]):
        import threading

        self.files, self._local = files, threading.local()

    def __call__(self, w: Window) -> np.ndarray:
        from torchcodec.decoders import VideoDecoder

        decoders = self._local.__dict__.setdefault("d", {})
        e, start, n = w
        if e not in decoders:
            decoders[e] = VideoDecoder(str(self.files[e]), dimension_order="NHWC")
        return decoders[e].get_frames_in_range(start, start + n).data.numpy()


class SpdlWindows:
    """Windows from MP4 files with SPDL: demux the time range, decode, convert to RGB."""

    def __init__(self, files: list[Path], fps: int):
        import spdl.io

        self.files, self.fps = files, fps
        self.filter = spdl.io.get_video_filter_desc(pix_fmt="rgb24")

    def __call__(self, w: Window) -> np.ndarray:
        import spdl.io

        e, start, n = w
        # frame i is shown over [i/fps, (i+1)/fps): the range picks exactly frames start..+n-1
        ts = ((start - 0.5) / self.fps, (start + n - 0.5) / self.fps) if start else None
        ts = ts or (0.0, (n - 0.5) / self.fps)
        packets = spdl.io.demux_video(str(self.files[e]), timestamp=ts)
        frames = spdl.io.decode_packets(packets, filter_desc=self.filter)
        return spdl.io.to_numpy(spdl.io.convert_frames(frames))


def window_batches(
    read: Callable[[Window], np.ndarray], windows: list[Window], batch: int, threads: int
) -> Iterator[np.ndarray]:
    """``[batch, T, H, W, 3]`` arrays of ``windows`` in order; ``threads`` decode in parallel."""
    groups = [windows[i : i + batch] for i in range(0, len(windows), batch)]
    if threads <= 1:
        for g in groups:
            yield np.stack([read(w) for w in g])
        return
    with ThreadPoolExecutor(threads) as pool:
        for g in groups:
            yield np.stack(list(pool.map(read, g)))


def check_equal(name: str, got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Refuse to time a peer whose frames differ from treadle's (same bytes, same window)."""
    if got.shape != want.shape:
        raise AssertionError(f"{name}: {what} has shape {got.shape}, treadle {want.shape}")
    diff = int(np.abs(got.astype(np.int16) - want.astype(np.int16)).max())
    if diff:
        raise AssertionError(f"{name}: {what} differs from treadle's frames by up to {diff}")


# -- LeRobotDataset ---------------------------------------------------------------------------


def lerobot_dataset(
    root: Path, make: Callable[[], list[np.ndarray]], fps: int, codec: str, gop: int
) -> Path:
    """A LeRobot v3 dataset of the episodes ``make()`` returns (``[F, H, W, 3]`` each), by
    LeRobot's writer; made once (``make`` is not called when it exists)."""
    define_torchvision_ops()
    import lerobot.datasets.lerobot_dataset as L
    import lerobot.datasets.video_utils as V

    out = root / f"lerobot-{codec}-g{gop}"
    if (out / "done").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    episodes = make()
    h, w = episodes[0].shape[1:3]
    features = {
        "observation.images.cam": {
            "dtype": "video",
            "shape": (h, w, 3),
            "names": ["height", "width", "channels"],
        },  # fmt: skip
        "action": {"dtype": "float32", "shape": (7,), "names": None},
    }
    encode = functools.partial(V.encode_video_frames, g=gop)
    saved = L.encode_video_frames
    L.encode_video_frames = encode  # LeRobot's own encoder, with the GOP we ask for
    try:
        ds = L.LeRobotDataset.create(
            "bench/cam", fps, features, root=out, vcodec=codec, image_writer_threads=2
        )
        for frames in episodes:
            for f in frames:
                ds.add_frame(
                    {"observation.images.cam": f, "action": np.zeros(7, np.float32), "task": "t"}
                )
            ds.save_episode()
        ds.finalize()
    finally:
        L.encode_video_frames = saved
    (out / "done").write_text(json.dumps({"codec": codec, "gop": gop}))
    return out


class LeRobotItems:
    """A ``LeRobotDataset`` with ``delta_timestamps`` windows, at the given items.

    It pickles as its arguments, not as the dataset: a spawned DataLoader worker rebuilds
    it after defining torchvision's two operator schemas (unpickling LeRobot's own objects
    imports torchvision first, which fails on the CPU torch build).
    """

    def __init__(self, path: Path, items: list[int], frames: int, fps: int):
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        self.args = (path, items, frames, fps)
        self.items = items
        self.ds = LeRobotDataset(
            "bench/cam",
            root=path,
            delta_timestamps={"observation.images.cam": [i / fps for i in range(frames)]},
            video_backend="torchcodec",
        )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.ds[self.items[i]]

    def __reduce__(self) -> tuple[Any, tuple]:
        return _lerobot_items, self.args


def _lerobot_items(*args: Any) -> LeRobotItems:
    define_torchvision_ops()
    return LeRobotItems(*args)


def lerobot_batches(
    path: Path, windows: list[Window], frames_per_episode: int, fps: int, batch: int, workers: int
) -> Iterator[Any]:
    """LeRobot's ``delta_timestamps`` windows through a DataLoader, items at ``windows``."""
    define_torchvision_ops()
    import torch

    items = [e * frames_per_episode + start for e, start, _ in windows]
    dl = torch.utils.data.DataLoader(
        LeRobotItems(path, items, windows[0][2], fps),
        batch_size=batch,
        num_workers=workers,
        multiprocessing_context="spawn" if workers else None,
    )
    for b in dl:
        yield b["observation.images.cam"]


# -- the windows treadle's plan picked --------------------------------------------------------


def plan_windows(plan: Any, steps: range) -> list[Window]:
    """(episode, first frame, frames) of every window of ``steps`` of a one-table video plan."""
    table = plan.table(0)
    starts = np.asarray(table.episodes().starts)
    offsets = np.asarray(plan.windows(0)["cam"].offsets)
    if not np.array_equal(offsets, np.arange(offsets[0], offsets[0] + len(offsets))):
        raise ValueError("peer rows need contiguous windows")
    out = []
    for s in steps:
        for m in plan.batch(s).moment:
            e = int(np.searchsorted(starts, m, side="right") - 1)
            out.append((e, int(m - starts[e] + offsets[0]), len(offsets)))
    return out


def episode_streams(plan: Any, root: Path) -> list[Path]:
    """The Annex-B file of each episode of the plan's table, in episode order."""
    from treadle.video import index_from_arrow

    table = plan.table(0)
    eps = table.episodes()
    col = table.to_arrow(["cam"]).column("cam")
    media = root / "treadle" / "projects" / "bench"
    keys = [index_from_arrow(col.slice(int(s), int(n)))[0] for s, n in zip(eps.starts, eps.lengths)]
    return [media / k for k in keys]


# -- the rows of the suite --------------------------------------------------------------------

LEROBOT_CODECS = (
    ("libsvtav1", 2, "its default AV1 g=2"),
    ("h264", 30, "H.264 g=30 like treadle's"),
)


def rows(
    root: Path, plan: Any, sz: dict[str, Any], steps: int, batch: int,
    frames_of: Callable[[int], np.ndarray], want: np.ndarray, log: Callable[[str], None],
    warmup: int = 0,
) -> list[tuple[Any, Callable[[], Any] | None]]:  # fmt: skip
    """``(Result, run)`` pairs of the peer rows for one window size (``run`` None: not run).

    ``want`` is treadle's first batch of the plan (``[batch, T, H, W, 3]`` uint8): each
    same-bytes peer's first batch must equal it before it is timed; ``warmup`` batches after
    the first are read before timing starts, as for treadle's rows.
    """
    from benchlib import Result, measure

    lab = f"{sz['window']}x{sz['w']}x{sz['h']}"
    n, fps = sz["windows"], 30
    wins = plan_windows(plan, range(steps))
    out: list[tuple[Any, Callable[[], Any] | None]] = []

    def row(name: str, label: str, cores: int, **config: Any) -> Any:
        r = Result("video", name, {"size": lab, "cores": cores, **config}, "frames/s")
        r.config["label"] = label
        return r

    def timed(make: Callable[[], Iterator[Any]]) -> Callable[[], Any]:
        def run() -> Any:
            r = measure(make, n, len, warmup)
            r.samples *= sz["window"]
            return r

        return run

    files: list[Path] | None = None
    for name, make_reader in (
        ("torchcodec", lambda f: TorchcodecWindows(f)),
        ("spdl", lambda f: SpdlWindows(f, fps)),
    ):
        state, why = status(name)
        for threads in (1, 2):
            label = f"{name} [{'get_frames_in_range' if name == 'torchcodec' else 'demux+decode+convert'}] threads={threads}"  # fmt: skip
            r = row(name, label, threads, threads=threads)
            if state != "ok":
                r.status, r.note = state, why
                out.append((r, None))
                continue
            if files is None:
                files = mp4_streams(root, [str(p) for p in episode_streams(plan, root)], fps)
            first = next(window_batches(make_reader(files), wins[:batch], batch, threads))
            try:
                check_equal(name, first, want, f"{lab} step 0")
            except AssertionError as e:  # not the same work: no number
                r.status = f"failed: {e}"
                out.append((r, None))
                continue

            def make(f=files, m=make_reader, t=threads) -> Iterator[Any]:
                return window_batches(m(f), wins, batch, t)

            out.append((r, timed(make)))
    state, why = status("lerobot")
    for codec, gop, what in LEROBOT_CODECS:
        for workers in (0, 2):
            r = row("lerobot", f"LeRobotDataset delta_timestamps, {what}, workers={workers}",
                    max(1, workers), workers=workers, codec=codec)  # fmt: skip
            if state != "ok":
                r.status, r.note = state, why
                out.append((r, None))
                continue

            def episodes(codec=codec, gop=gop) -> list[np.ndarray]:
                log(f"  LeRobot's writer: {sz['episodes']} episodes, {codec} g={gop}")
                return [frames_of(e) for e in range(sz["episodes"])]

            path = lerobot_dataset(root / lab, episodes, fps, codec, gop)

            def make(p=path, w=workers) -> Iterator[Any]:
                return lerobot_batches(p, wins, sz["frames"], fps, batch, w)

            out.append((r, timed(make)))
    return out
