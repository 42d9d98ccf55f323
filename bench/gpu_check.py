"""GPU check (issue 8): GPU vs CPU video path, raw NVDEC rate, parity; writes one JSON.

Per window shape (90x224x224 and 16x640x480 uint8 windows, plus 16x640x480 resized to
224x224 float32 normalised), on the same stored H.264 streams and the same windows:

* ``cpu``: the CPU path (:class:`treadle.video.VideoReader`, ``--cpu-threads`` decode
  threads), batch stacked in pinned memory and copied to the GPU;
* ``gpu``: :class:`treadle.gpu.GpuVideoReader` (NVDEC + fused kernel) into a CUDA batch;
* ``raw_nvdec``: the same byte ranges decoded by NVDEC with no conversion, on the same
  number of sessions: the limit the GPU path is measured against (goal >= 0.9x);
* ``parity``: max/mean abs difference between the GPU and the CPU batch.

Rates count *decoded* frames (packets, warm-up frames included) and *output* frames.
``--cpu-only`` runs the CPU path and the GPU reader's pipeline on the CPU (software
decode, torch transform); ``--dry-run`` does that on tiny windows (seconds, no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

import treadle.video as tv
from treadle.gpu.nvdec_decode import NvdecDecoder
from treadle.gpu.nvdec_reader import GpuVideoReader
from treadle.plan.windows import Video
from treadle.storage import Store
from treadle.video._testing import synthetic_frames
from treadle.video.frame_spec import FrameSpec

WHERE = ("bench", "episode", "camera")
CONFIGS = {
    "90x224x224": dict(h=224, w=224, video=Video(range(90)), episode=300, batch=8),
    "16x640x480": dict(h=480, w=640, video=Video(range(16)), episode=240, batch=8),
    "16x640x480->224x224f32": dict(
        h=480,
        w=640,
        video=Video(
            range(16),
            size=(224, 224),
            layout="TCHW",
            dtype="float32",
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
        ),
        episode=240,
        batch=8,
    ),
}
TINY = {"6x64x64": dict(h=64, w=64, video=Video(range(6)), episode=40, batch=2)}


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_store(root: Path, cfg: dict, streams: int = 2):
    """``streams`` encoded episodes in a local store; returns (store, [(key, index)])."""
    store = Store.open(str(root), create=True)
    out = []
    for i in range(streams):
        frames = synthetic_frames(cfg["episode"], cfg["h"], cfg["w"], seed=i)
        s = tv.encode_frames(frames, gop=30, preset="veryfast")
        key = s.media_key(f"bench{i}")
        store.put(f"projects/p/{key}", s.data)
        out.append(tv.index_from_arrow(tv.index_to_arrow(key, s)))
    return store, out


def batches(cfg: dict, episodes, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = len(cfg["video"].offsets)
    out = []
    for _ in range(n):
        reqs = []
        for _ in range(cfg["batch"]):
            key, index = episodes[int(rng.integers(len(episodes)))]
            start = int(rng.integers(0, len(index) - t + 1))
            reqs.append(
                tv.WindowRequest(key, index, np.arange(start, start + t), cfg["video"], WHERE)
            )
        out.append(reqs)
    return out


def summarise(latencies: list[float], out_frames: int, decoded: int, wall: float) -> dict:
    return {
        "batches": len(latencies),
        "batch_latency_ms_median": 1e3 * statistics.median(latencies),
        "batch_latency_ms_max": 1e3 * max(latencies),
        "output_frames_per_s": out_frames / wall,
        "decoded_frames_per_s": decoded / wall,
    }


def decoded_frames(reqs) -> int:
    return sum(tv.plan_window(r.index, r.frames).num_packets for r in reqs)


def run_cpu(store, work, device: str, threads: int) -> tuple[dict, list]:
    lat, first = [], None
    out_frames = decoded = 0
    with tv.VideoReader(store, prefix="projects/p", threads=threads) as reader:
        reader.read(work[0])  # warm-up
        t0 = time.perf_counter()
        for reqs in work[1:]:
            s = time.perf_counter()
            outs = reader.read(reqs)
            batch = torch.stack([torch.as_tensor(o) for o in outs])
            if device == "cuda":
                batch = batch.pin_memory().to("cuda", non_blocking=True)
                torch.cuda.synchronize()
            lat.append(time.perf_counter() - s)
            first = first if first is not None else batch
            out_frames += batch.shape[0] * batch.shape[1]
            decoded += decoded_frames(reqs)
        wall = time.perf_counter() - t0
    return summarise(lat, out_frames, decoded, wall), first


def run_gpu(store, work, device: str, streams: int, hw: bool, impl: str) -> tuple[dict, list]:
    lat, first = [], None
    out_frames = decoded = 0
    spec = work[0][0].spec.frame
    idx = work[0][0].index
    t = len(work[0][0].frames)
    shape = (len(work[0]), *spec.shape(t, idx.height, idx.width))
    with GpuVideoReader(
        store, device=device, prefix="projects/p", streams=streams, hw=hw, impl=impl
    ) as reader:
        reader.read(work[0])  # warm-up: decoders, kernel compile
        t0 = time.perf_counter()
        for reqs in work[1:]:
            s = time.perf_counter()
            batch = torch.empty(shape, dtype=spec.torch_dtype, device=device)
            reader.read([_with_out(r, batch[i]) for i, r in enumerate(reqs)])
            lat.append(time.perf_counter() - s)
            first = first if first is not None else batch
            out_frames += batch.shape[0] * batch.shape[1]
            decoded += decoded_frames(reqs)
        wall = time.perf_counter() - t0
    return summarise(lat, out_frames, decoded, wall), first


def _with_out(req, out):
    import dataclasses

    return dataclasses.replace(req, out=out)


def run_raw_nvdec(store, work, streams: int) -> dict:
    """The same windows' byte ranges through NVDEC only (frames counted, not converted)."""
    jobs = []
    for reqs in work[1:]:
        for r in reqs:
            plan = tv.plan_window(r.index, r.frames)
            data = store.get_ranges([_range(r.key, plan)])[0]
            jobs.append((data, plan))
    local = threading.local()

    def one(job) -> int:
        dec = getattr(local, "dec", None)
        if dec is None:
            dec = local.dec = NvdecDecoder("cuda", hw=True)
        n = 0
        for f in dec.frames(*job):
            n += 1
            assert f.format.name == "cuda", "NVDEC fell back to software decoding"
        return n

    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(one, jobs[: streams * 2]))  # warm-up: one session per thread
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = sum(pool.map(one, jobs))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    return {"decoded_frames_per_s": n / wall, "frames": n, "sessions": streams}


def _range(key: str, plan):
    from treadle.storage import RangeRequest

    return RangeRequest(f"projects/p/{key}", plan.start, plan.end)


def parity(cpu_batch: torch.Tensor, gpu_batch: torch.Tensor, video: Video) -> dict:
    d = (cpu_batch.cpu().float() - gpu_batch.cpu().float()).abs()
    scale = 1.0 if video.dtype == "uint8" else max(video.frame.affine()[0])
    return {
        "max_abs_diff": float(d.max()),
        "mean_abs_diff": float(d.mean()),
        "max_abs_diff_levels": float(d.max()) / scale,
        "bound_levels": 0 if video.size is None else 7,
        "ok": float(d.max()) / scale <= (0 if video.size is None else 7) + 0.5,
    }


def tolerance_table() -> list[dict]:
    """Max/mean abs diff (uint8 levels) of the torch reference vs FFmpeg's scaler.

    Decoded H.264 frames (left chroma siting) per colour tagging, output size and
    scaler flags: ``SWS_PARITY_FLAGS`` vs ``chroma="full"`` and PyAV's default
    ``BILINEAR`` (the CPU path's flags) vs ``chroma="sws_default"``.
    """
    from fractions import Fraction

    import av

    from treadle.gpu.yuv_colour import colour_from_annexb
    from treadle.gpu.yuv_to_tensor import SWS_PARITY_FLAGS, reference_convert

    frames = synthetic_frames(2, 96, 128, seed=7)
    rows = []
    for cs, cr, label in (
        (None, None, "untagged(601,tv)"),
        (1, 1, "709,tv"),
        (1, 2, "709,pc"),
        (6, 2, "601,pc"),
    ):
        cc = av.CodecContext.create("libx264", "w")
        cc.width, cc.height, cc.pix_fmt = 128, 96, "yuv420p"
        cc.time_base = Fraction(1, 30)
        cc.options = {"x264-params": "bframes=0:annexb=1:repeat-headers=1"}
        if cs is not None:
            cc.colorspace, cc.color_range = cs, cr
        packets = []
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24").reformat(
                format="yuv420p", dst_colorspace=cs, dst_color_range=cr
            )
            vf.pts = i
            packets += [bytes(p) for p in cc.encode(vf)]
        packets += [bytes(p) for p in cc.encode(None)]
        dec = av.CodecContext.create("h264", "r")
        decoded = [f for p in packets for f in dec.decode(av.Packet(p))] + dec.decode(None)
        colour = colour_from_annexb(packets[0])
        for size in (None, (48, 64), (72, 96), (224, 224)):
            for flags, chroma in ((SWS_PARITY_FLAGS, "full"), ("BILINEAR", "sws_default")):
                worst, mean = 0, 0.0
                for f in decoded:
                    h, w = size or (f.height, f.width)
                    want = f.to_ndarray(format="rgb24", width=w, height=h, interpolation=flags)
                    planes = [
                        torch.from_numpy(
                            np.frombuffer(bytes(p), np.uint8)
                            .reshape(p.height, p.line_size)[:, : p.width]
                            .copy()
                        )[None]
                        for p in f.planes
                    ]
                    got = torch.empty(1, h, w, 3, dtype=torch.uint8)
                    reference_convert(*planes, got, FrameSpec(size), colour, chroma)
                    d = (got[0].int() - torch.from_numpy(want.copy()).int()).abs()
                    worst, mean = max(worst, int(d.max())), max(mean, float(d.float().mean()))
                rows.append(
                    {
                        "tags": label,
                        "size": "native 96x128" if size is None else f"{size[0]}x{size[1]}",
                        "flags": "parity" if chroma == "full" else "BILINEAR (CPU path)",
                        "max_abs_diff": worst,
                        "mean_abs_diff": round(mean, 3),
                    }
                )
    return rows


def machine() -> dict:
    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
    }
    try:
        import av

        info["av"] = av.__version__
    except Exception:
        pass
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/gpu_check.json")
    ap.add_argument("--batches", type=int, default=6, help="measured batches (+1 warm-up)")
    ap.add_argument("--streams", type=int, default=4, help="NVDEC sessions / worker threads")
    ap.add_argument("--cpu-threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument(
        "--cpu-only", action="store_true", help="no GPU: CPU path + GPU pipeline on CPU"
    )
    ap.add_argument("--dry-run", action="store_true", help="tiny windows, --cpu-only (seconds)")
    ap.add_argument("--configs", default="", help="comma-separated subset of config names")
    args = ap.parse_args(argv)
    cpu_only = args.cpu_only or args.dry_run or not torch.cuda.is_available()
    configs = TINY if args.dry_run else CONFIGS
    if args.configs:
        configs = {k: v for k, v in configs.items() if k in args.configs.split(",")}
    batches_n = 2 if args.dry_run else args.batches
    result = {"issue": 8, "machine": machine(), "cpu_only": cpu_only, "configs": {}}
    if not cpu_only:
        from treadle.gpu import NvdecBackend, select_backend

        b = select_backend("cuda")
        result["backend"] = {"name": b.name, "reason": getattr(b, "reason", None)}
        if not isinstance(b, NvdecBackend):
            log(f"GPU backend unavailable: {b.reason}")
            result["status"] = "no_nvdec"
            _write(args.out, result)
            return 1
        impl = b.transform
    else:
        impl = "torch"
    device = "cpu" if cpu_only else "cuda"
    log("tolerance table: torch reference vs FFmpeg's scaler")
    result["tolerance_vs_swscale"] = tolerance_table()
    for row in result["tolerance_vs_swscale"]:
        print("   ", json.dumps(row), flush=True)
    with tempfile.TemporaryDirectory(prefix="treadle-gpu-check-") as tmp:
        for name, cfg in configs.items():
            log(f"{name}: encoding {cfg['episode']} frames x2 at {cfg['w']}x{cfg['h']}")
            store, episodes = make_store(Path(tmp) / name, cfg)
            work = batches(cfg, episodes, batches_n + 1)
            entry: dict = {"batch": cfg["batch"], "window": cfg["video"].to_json()}
            log(f"{name}: CPU path ({args.cpu_threads} threads)")
            entry["cpu"], cpu_batch = run_cpu(store, work, device, args.cpu_threads)
            log(f"{name}: GPU path ({args.streams} streams, transform={impl}, hw={not cpu_only})")
            entry["gpu"], gpu_batch = run_gpu(
                store, work, device, args.streams, hw=not cpu_only, impl=impl
            )
            entry["parity"] = parity(cpu_batch, gpu_batch, cfg["video"])
            if not cpu_only:
                log(f"{name}: raw NVDEC ({args.streams} sessions)")
                entry["raw_nvdec"] = run_raw_nvdec(store, work, args.streams)
                raw = entry["raw_nvdec"]["decoded_frames_per_s"]
                entry["gpu_vs_raw_nvdec"] = entry["gpu"]["decoded_frames_per_s"] / raw
            entry["gpu_vs_cpu"] = (
                entry["gpu"]["output_frames_per_s"] / entry["cpu"]["output_frames_per_s"]
            )
            result["configs"][name] = entry
            log(f"{name}: {json.dumps(_brief(entry))}")
    ok = all(e["parity"]["ok"] for e in result["configs"].values())
    result["parity_ok"] = ok
    if not cpu_only:
        result["goal_0.9x_raw_nvdec"] = all(
            e["gpu_vs_raw_nvdec"] >= 0.9 for e in result["configs"].values()
        )
    result["status"] = "ok" if ok else "parity_failed"
    _write(args.out, result)
    return 0 if ok else 1


def _brief(e: dict) -> dict:
    out = {
        "cpu_fps": round(e["cpu"]["output_frames_per_s"]),
        "gpu_fps": round(e["gpu"]["output_frames_per_s"]),
        "cpu_ms": round(e["cpu"]["batch_latency_ms_median"], 1),
        "gpu_ms": round(e["gpu"]["batch_latency_ms_median"], 1),
        "max_diff_levels": e["parity"]["max_abs_diff_levels"],
    }
    if "raw_nvdec" in e:
        out["raw_nvdec_decoded_fps"] = round(e["raw_nvdec"]["decoded_frames_per_s"])
        out["gpu_decoded_fps"] = round(e["gpu"]["decoded_frames_per_s"])
        out["gpu_vs_raw"] = round(e["gpu_vs_raw_nvdec"], 3)
    return out


def _write(path: str, result: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
