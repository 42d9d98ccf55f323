"""The GPU reader's pipeline on CPU: software decoder + torch transform vs the CPU path.

``GpuVideoReader(device="cpu", hw=False)`` runs everything the GPU path runs except
NVDEC and CUDA: the same byte ranges, packets, pts matching, plane export by DLPack,
the conversion into slices of the output, the bounded worker queue and the fallbacks.
"""

from __future__ import annotations

import dataclasses
import warnings

import av
import numpy as np
import pytest
import torch

import treadle.video as tv
from treadle.errors import CorruptData, VideoError
from treadle.gpu import backend, fallback
from treadle.gpu.nvdec_decode import NvdecDecoder, chroma_location, decode_window_to, frame_planes
from treadle.gpu.nvdec_reader import GpuVideoReader
from treadle.gpu.yuv_colour import AVCHROMA_LOC_LEFT
from treadle.plan.windows import Video
from treadle.video._testing import store_stream, synthetic_frames
from treadle.video.frame_spec import FrameSpec

WHERE = ("grasps", "ep-0003", "wrist")


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())  # each test sees its first warnings


@pytest.fixture(scope="module")
def stream():
    return tv.encode_frames(synthetic_frames(40, 48, 64, seed=3), gop=10)


@pytest.fixture
def stored(tmp_path, stream):
    return store_stream(str(tmp_path / "root"), stream)


def requests(key, index, spec, starts=(0, 7, 25, 33)):
    n = len(spec.offsets)
    return [tv.WindowRequest(key, index, np.arange(s, s + n), spec, WHERE) for s in starts]


def cpu_read(store, reqs):
    with tv.VideoReader(store, prefix="projects/p") as r:
        return [torch.as_tensor(o) for o in r.read(reqs)]


def gpu_read(store, reqs, **kw):
    kw.setdefault("impl", "torch")
    with GpuVideoReader(store, device="cpu", prefix="projects/p", hw=False, **kw) as r:
        return r.read(reqs)


SPECS = [
    (Video(range(6)), 0),
    (Video(range(6), size=(32, 48)), 7),
    (Video(range(4), size=(64, 96), layout="TCHW"), 7),
    (Video([0, 2, 5], dtype="float32", mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3)), 0),
    (Video(range(3), size=(24, 32), layout="TCHW", dtype="bfloat16"), 7),
    (Video(range(3), dtype="float16"), 0),
]


@pytest.mark.parametrize(
    "spec,levels", SPECS, ids=[f"{s.size}-{s.layout}-{s.dtype}" for s, _ in SPECS]
)
def test_same_frames_as_the_cpu_path_within_tolerance(stored, spec, levels):
    store, key, index = stored
    reqs = requests(key, index, spec)
    want = cpu_read(store, reqs)
    got = gpu_read(store, reqs, streams=2)
    scale = spec.frame.affine()[0]
    for w, g in zip(want, got):
        assert g.shape == w.shape and g.dtype == w.dtype and g.device.type == "cpu"
        d = (w.float() - g.float()).abs()
        # tolerance in uint8 levels, times the float scale (plus the dtype's rounding)
        if levels == 0:  # native size: bit-identical to the CPU path
            assert torch.equal(w, g), (spec, float(d.max()))
        bound = levels if spec.dtype == "uint8" else levels * max(scale) + 0.02
        assert float(d.max()) <= bound, (spec, float(d.max()))
        if spec.dtype == "uint8":
            assert float(d.mean()) <= 3.0


def test_fills_slices_of_a_batch_in_place(stored):
    store, key, index = stored
    spec = Video(range(5), size=(24, 32), layout="TCHW", dtype="float32")
    reqs = requests(key, index, spec, starts=(3, 30))
    batch = torch.full((3, 5, 3, 24, 32), -1.0)
    reqs = [dataclasses.replace(r, out=batch[i]) for i, r in enumerate(reqs)]
    outs = gpu_read(store, reqs)
    assert outs[0].data_ptr() == batch[0].data_ptr() and outs[1].data_ptr() == batch[1].data_ptr()
    assert (batch[2] == -1).all() and (batch[:2] >= 0).all() and (batch[:2] <= 1).all()


def test_bad_out_is_refused_naming_the_window(stored):
    store, key, index = stored
    spec = Video(range(2))
    req = dataclasses.replace(requests(key, index, spec)[0], out=torch.empty(2, 48, 64, 3))
    with pytest.raises(VideoError, match="ep-0003.*window needs"):
        gpu_read(store, [req])


def test_corrupt_bytes_raise_corrupt_data_naming_the_window(tmp_path, stream):
    bad = bytearray(stream.data)
    bad[len(bad) // 2] ^= 0xFF
    store, key, index = store_stream(str(tmp_path / "root"), stream, data=bytes(bad))
    reqs = [tv.WindowRequest(key, index, np.arange(0, 40), Video(range(40)), WHERE)]
    with pytest.raises(CorruptData, match="ep-0003"):
        gpu_read(store, reqs)


def test_bounded_queue_with_many_windows(stored):
    store, key, index = stored
    spec = Video(range(3), size=(24, 32))
    reqs = requests(key, index, spec, starts=tuple(range(0, 36, 3)))
    want = gpu_read(store, reqs, streams=1)
    got = gpu_read(store, reqs, streams=3, max_in_flight=1)  # submit waits for each window
    assert len(got) == len(reqs)
    with GpuVideoReader(store, device="cpu", prefix="projects/p", hw=False, impl="torch") as r:
        _, stats = r.read_with_stats(reqs)
    with tv.VideoReader(store, prefix="projects/p") as r:
        _, cpu_stats = r.read_with_stats(reqs)
    assert stats.window_bytes == cpu_stats.window_bytes  # the same byte ranges
    assert stats.packets_decoded == cpu_stats.packets_decoded
    assert stats.frames_out == cpu_stats.frames_out == 3 * len(reqs)
    for w, g in zip(want, got):
        assert torch.equal(w, g)


def test_unsupported_codec_goes_to_the_cpu_path_with_one_warning(stored):
    store, key, index = stored
    odd = dataclasses.replace(index, codec="hevc")
    spec = Video(range(4))
    reqs = requests(key, odd, spec, starts=(1, 20))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        got = gpu_read(store, reqs)
    msgs = [str(w.message) for w in rec if issubclass(w.category, backend.GpuFallbackWarning)]
    assert len(msgs) == 1 and "hevc" in msgs[0]
    want = cpu_read(store, requests(key, index, spec, starts=(1, 20)))
    for w, g in zip(want, got):
        assert torch.equal(w, g)  # exactly the CPU path's frames


class CountingStore:
    """The real store, counting its ``get_ranges`` calls (a spy: bytes come from disk)."""

    def __init__(self, store):
        self.store, self.calls = store, []

    def get_ranges(self, ranges):
        self.calls.append(len(ranges))
        return self.store.get_ranges(ranges)


@pytest.mark.parametrize("hw", [False, True], ids=["cpu-codec", "nvdec-error"])
def test_cpu_fallback_decodes_the_bytes_fetched_once(stored, hw):
    """The GPU reader's CPU fallback starts from the same fetched, verified window: one
    ``get_ranges`` per batch, never a second fetch per window."""
    if hw and torch.cuda.is_available():
        pytest.skip("needs a machine without NVDEC")
    store, key, index = stored
    idx = index if hw else dataclasses.replace(index, codec="hevc")
    reqs = requests(key, idx, Video(range(4), size=(24, 32)), starts=(1, 20, 33))
    spy = CountingStore(store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", backend.GpuFallbackWarning)
        with GpuVideoReader(spy, device="cpu", prefix="projects/p", hw=hw, impl="torch") as r:
            got = r.read(reqs)
    assert spy.calls == [3]
    for w, g in zip(cpu_read(store, requests(key, index, reqs[0].spec, (1, 20, 33))), got):
        assert torch.equal(w, g)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without NVDEC")
def test_nvdec_failure_retries_on_the_cpu_path(stored):
    """hw=True on a machine without NVDEC: every window falls back, warned once."""
    store, key, index = stored
    spec = Video(range(4), size=(24, 32))
    reqs = requests(key, index, spec, starts=(0, 11))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with GpuVideoReader(store, device="cpu", prefix="projects/p", hw=True, impl="torch") as r:
            got = r.read(reqs)
    msgs = [str(w.message) for w in rec if issubclass(w.category, backend.GpuFallbackWarning)]
    assert len(msgs) == 1 and "CPU path" in msgs[0]
    for w, g in zip(cpu_read(store, reqs), got):
        assert torch.equal(w, g)


def test_decoder_context_is_reused_across_windows(stored, stream):
    store, key, index = stored
    dec = NvdecDecoder("cpu", hw=False)
    ctx = dec.context()
    spec = FrameSpec((24, 32))
    for start in (0, 12, 30):
        plan = tv.plan_window(index, np.arange(start, start + 5))
        data = stream.data[plan.start : plan.end]
        out = torch.empty(5, 24, 32, 3, dtype=torch.uint8)
        assert decode_window_to(dec, data, plan, out, spec, "w") == plan.num_packets
        assert dec.context() is ctx
        assert chroma_location(data) == AVCHROMA_LOC_LEFT


def test_frame_planes_of_software_frames():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    for fmt in ("yuv420p", "nv12"):
        f = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format=fmt)
        y, u, v, on_gpu = frame_planes(f, torch.device("cpu"))
        assert not on_gpu
        assert y.shape == (20, 30) and u.shape == (10, 15) and v.shape == (10, 15)
        i420 = f.reformat(format="yuv420p").to_ndarray()  # [H * 3/2, W]
        assert np.array_equal(y.numpy(), i420[:20])
        assert np.array_equal(u.contiguous().numpy().reshape(-1), i420[20:25].reshape(-1))
        assert np.array_equal(v.contiguous().numpy().reshape(-1), i420[25:30].reshape(-1))


def test_follows_the_cpu_paths_scaler_flags(stored, monkeypatch):
    """If the CPU path resizes with SWS_PARITY_FLAGS, the GPU path is within 1 level."""
    import treadle.video.cpu_decode as cpu_decode
    from treadle.gpu.nvdec_decode import cpu_chroma_mode
    from treadle.gpu.yuv_to_tensor import SWS_PARITY_FLAGS

    store, key, index = stored
    assert cpu_chroma_mode() == "sws_default"  # "BILINEAR"
    monkeypatch.setattr(cpu_decode, "RESIZE_INTERPOLATION", SWS_PARITY_FLAGS)
    assert cpu_chroma_mode() == "full"
    for spec in (Video(range(4), size=(32, 48)), Video(range(4), size=(72, 96), layout="TCHW")):
        reqs = requests(key, index, spec, starts=(2, 30))
        for w, g in zip(cpu_read(store, reqs), gpu_read(store, reqs)):
            assert int((w.int() - g.int()).abs().max()) <= 1
