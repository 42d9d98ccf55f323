"""On an NVIDIA GPU only (skipped elsewhere): NVDEC decode, the compiled kernel, the reader.

Run by bench/gpu_check.sh. Expectations: NVDEC's NV12 planes equal FFmpeg's software
decode bit for bit (H.264 decoding is exact); GPU batches equal the CPU path's within
the tolerance stated in tests/test_gpu_transform.py (uint8: identical at native size,
<= 7 levels resized, with the CPU path's default BILINEAR flags), and the GPU reader on CUDA equals
the same pipeline on CPU (torch reference) within 1 level.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import treadle.video as tv
from treadle.gpu import NvdecBackend, select_backend
from treadle.gpu.nvdec_decode import NvdecDecoder, frame_planes
from treadle.gpu.nvdec_reader import GpuVideoReader
from treadle.plan.windows import Video
from treadle.video._testing import store_stream, synthetic_frames
from treadle.video.frame_spec import FrameSpec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

WHERE = ("grasps", "ep-0001", "front")


@pytest.fixture(scope="module")
def stream():
    return tv.encode_frames(synthetic_frames(60, 96, 128, seed=1), gop=15)


@pytest.fixture
def stored(tmp_path, stream):
    return store_stream(str(tmp_path / "root"), stream)


def reqs_for(key, index, spec, starts=(0, 9, 31, 50)):
    n = len(spec.offsets)
    return [tv.WindowRequest(key, index, np.arange(s, s + n), spec, WHERE) for s in starts]


def test_select_backend_picks_nvdec():
    b = select_backend("cuda")
    assert isinstance(b, NvdecBackend), f"fell back to the CPU: {getattr(b, 'reason', b)}"
    assert b.transform == "triton"


def test_nvdec_planes_equal_software_decode(stream):
    plan = tv.plan_window(stream.index, np.arange(0, 30))
    data = stream.data[plan.start : plan.end]
    hw = {f.pts: f for f in NvdecDecoder("cuda", hw=True).frames(data, plan)}
    sw = {f.pts: f for f in NvdecDecoder("cpu", hw=False).frames(data, plan)}
    assert sorted(hw) == sorted(sw) and len(hw) == 30
    for pts, f in hw.items():
        assert f.format.name == "cuda"
        yh, uh, vh, on_gpu = frame_planes(f, torch.device("cuda"))
        assert on_gpu and yh.is_cuda
        torch.cuda.synchronize()
        ys, us, vs, _ = frame_planes(sw[pts], torch.device("cpu"))
        for a, b in ((yh, ys), (uh, us), (vh, vs)):
            assert torch.equal(a.cpu(), b), f"pts {pts}: NVDEC plane differs from software"


SPECS = [
    (Video(range(8)), 0),
    (Video(range(8), size=(56, 56), layout="TCHW"), 7),
    (Video(range(4), size=(224, 224), dtype="float32", mean=(0.5,) * 3, std=(0.25,) * 3), 7),
    (Video(range(4), size=(48, 64), layout="TCHW", dtype="bfloat16"), 7),
]


@pytest.mark.parametrize("spec,levels", SPECS, ids=[f"{s.size}-{s.dtype}" for s, _ in SPECS])
def test_gpu_batches_match_cpu_path(stored, spec, levels):
    store, key, index = stored
    reqs = reqs_for(key, index, spec)
    with tv.VideoReader(store, prefix="projects/p") as r:
        cpu = [torch.as_tensor(o) for o in r.read(reqs)]
    with GpuVideoReader(store, device="cuda", prefix="projects/p", streams=3) as r:
        gpu = r.read(reqs)
    with GpuVideoReader(store, device="cpu", prefix="projects/p", hw=False, impl="torch") as r:
        same_pipeline_on_cpu = r.read(reqs)
    scale = max(spec.frame.affine()[0]) if spec.dtype != "uint8" else 1.0
    for c, g, p in zip(cpu, gpu, same_pipeline_on_cpu):
        assert g.is_cuda and g.shape == c.shape and g.dtype == c.dtype
        g = g.cpu().float()
        assert float((g - c.float()).abs().max()) <= levels * scale + (0.02 if levels else 0)
        assert float((g - p.float()).abs().max()) <= 1 * scale + 0.02


def test_gpu_reader_fills_a_cuda_batch_with_several_streams(stored):
    store, key, index = stored
    spec = Video(range(6), size=(48, 64), layout="TCHW", dtype="float16")
    reqs = reqs_for(key, index, spec, starts=tuple(range(0, 54, 6)))
    batch = torch.zeros((len(reqs), 6, 3, 48, 64), dtype=torch.float16, device="cuda")
    reqs = [dataclasses.replace(r, out=batch[i]) for i, r in enumerate(reqs)]
    with GpuVideoReader(store, device="cuda", prefix="projects/p", streams=4, max_in_flight=3) as r:
        outs, stats = r.read_with_stats(reqs)
        outs2 = r.read(reqs)  # decoders reused
    assert all(o.data_ptr() == batch[i].data_ptr() for i, o in enumerate(outs))
    assert stats.frames_out == 6 * len(reqs)
    assert float(batch.float().std()) > 0.05
    assert all(torch.equal(a, b) for a, b in zip(outs, outs2))


def test_torch_reference_on_cuda_matches_cpu():
    from treadle.gpu.yuv_colour import Colour
    from treadle.gpu.yuv_to_tensor import reference_convert

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 256, (2, 64, 80), dtype=torch.uint8, generator=g)
    u = torch.randint(0, 256, (2, 32, 40), dtype=torch.uint8, generator=g)
    v = torch.randint(0, 256, (2, 32, 40), dtype=torch.uint8, generator=g)
    spec = FrameSpec((48, 48))
    a = torch.empty(2, 48, 48, 3, dtype=torch.uint8)
    b = torch.empty(2, 48, 48, 3, dtype=torch.uint8, device="cuda")
    reference_convert(y, u, v, a, spec, Colour())
    reference_convert(y.cuda(), u.cuda(), v.cuda(), b, spec, Colour())
    assert int((a.int() - b.cpu().int()).abs().max()) <= 1
