"""Backend selection and fallback: no GPU here, so availability is also monkeypatched."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

import treadle.gpu as tg
from treadle.gpu import backend, fallback


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())  # each test sees its first warnings
    monkeypatch.delenv("TREADLE_VIDEO_DECODE", raising=False)


def gpu_warnings(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        result = fn(*args, **kw)
    return result, [w for w in rec if issubclass(w.category, tg.GpuFallbackWarning)]


def fake_gpu(monkeypatch, cuda=None, nvdec=None, triton=None):
    monkeypatch.setattr(backend, "cuda_unavailable", lambda device: cuda)
    monkeypatch.setattr(backend, "nvdec_unavailable", lambda index: nvdec)
    monkeypatch.setattr(backend, "triton_unavailable", lambda: triton)


def test_import_needs_no_gpu_and_no_triton():
    code = "import sys, treadle.gpu; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_cpu_device_is_cpu_backend_silently():
    b, ws = gpu_warnings(tg.select_backend, "cpu")
    assert isinstance(b, tg.CpuBackend) and b.reason is None and not b.on_device
    assert b.device == torch.device("cpu")
    assert ws == []
    b, ws = gpu_warnings(tg.select_backend, None)
    assert isinstance(b, tg.CpuBackend) and ws == []


NO_GPU_HERE = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without GPU")


@NO_GPU_HERE
def test_cuda_without_gpu_falls_back_with_one_warning():
    """The real probes on this machine: no CUDA, so CPU, warned once per process."""
    b, ws = gpu_warnings(tg.select_backend, "cuda")
    assert isinstance(b, tg.CpuBackend)
    assert b.device.type == "cuda"  # batches still go to the device the caller asked for
    assert "CUDA" in b.reason
    assert len(ws) == 1 and "decoding video on the CPU" in str(ws[0].message)
    b2, ws2 = gpu_warnings(tg.select_backend, "cuda:0")
    assert isinstance(b2, tg.CpuBackend) and ws2 == []


@NO_GPU_HERE
def test_real_nvdec_probe_reports_a_reason_here():
    backend.nvdec_unavailable.cache_clear()
    try:
        reason = backend.nvdec_unavailable(0)
    finally:
        backend.nvdec_unavailable.cache_clear()
    assert isinstance(reason, str) and reason


def test_probe_stream_is_valid_h264():
    import av

    from treadle.video.encode import probe_stream

    data = probe_stream()
    cc = av.CodecContext.create("h264", "r")
    frames = []
    for p in cc.parse(data):
        frames += cc.decode(p)
    frames += cc.decode(None)
    assert frames and frames[0].width == 64


def test_nvdec_missing_falls_back_and_names_the_reason(monkeypatch):
    fake_gpu(monkeypatch, nvdec="NVDEC could not be opened on cuda:0 (no libnvcuvid)")
    b, ws = gpu_warnings(tg.select_backend, "cuda:0")
    assert isinstance(b, tg.CpuBackend) and "libnvcuvid" in b.reason
    assert len(ws) == 1 and "libnvcuvid" in str(ws[0].message)
    _, ws = gpu_warnings(tg.select_backend, "cuda:0")
    assert ws == []
    # a different reason is worth its own warning
    fake_gpu(monkeypatch, nvdec="NVDEC decoded to 'yuv420p' frames, not CUDA frames")
    _, ws = gpu_warnings(tg.select_backend, "cuda:0")
    assert len(ws) == 1 and "yuv420p" in str(ws[0].message)


def test_everything_available_is_nvdec_with_the_fused_kernel(monkeypatch):
    fake_gpu(monkeypatch)
    b, ws = gpu_warnings(tg.select_backend, "cuda:1")
    assert isinstance(b, tg.NvdecBackend)
    assert b.device == torch.device("cuda", 1) and b.transform == "triton" and b.on_device
    assert ws == []


def test_missing_triton_keeps_nvdec_with_torch_transform(monkeypatch):
    fake_gpu(monkeypatch, triton="triton is not installed")
    b, ws = gpu_warnings(tg.select_backend, "cuda:0")
    assert isinstance(b, tg.NvdecBackend) and b.transform == "torch"
    assert len(ws) == 1 and "triton" in str(ws[0].message)
    _, ws = gpu_warnings(tg.select_backend, "cuda:0")
    assert ws == []


def test_prefer_cpu_and_env_override(monkeypatch):
    fake_gpu(monkeypatch)
    b, ws = gpu_warnings(tg.select_backend, "cuda:0", prefer="cpu")
    assert isinstance(b, tg.CpuBackend) and b.reason is None and ws == []
    monkeypatch.setenv("TREADLE_VIDEO_DECODE", "cpu")
    assert isinstance(tg.select_backend("cuda:0"), tg.CpuBackend)
    monkeypatch.setenv("TREADLE_VIDEO_DECODE", "auto")
    assert isinstance(tg.select_backend("cuda:0"), tg.NvdecBackend)


def test_prefer_nvdec_raises_instead_of_falling_back(monkeypatch):
    fake_gpu(monkeypatch, cuda="CUDA is not available")
    with pytest.raises(tg.GpuUnavailable, match="CUDA is not available"):
        tg.select_backend("cuda", prefer="nvdec")
    with pytest.raises(ValueError, match="prefer"):
        tg.select_backend("cuda", prefer="gpu")


def test_backends_build_their_readers(tmp_path, monkeypatch):
    from treadle.gpu.nvdec_reader import GpuVideoReader
    from treadle.storage import Store
    from treadle.video import VideoReader

    store = Store.open(str(tmp_path / "root"), create=True)
    with tg.CpuBackend(torch.device("cpu")).video_reader(store, prefix="projects/p") as r:
        assert isinstance(r, VideoReader)
    nv = tg.NvdecBackend(torch.device("cuda", 0), "torch")
    with tg.CpuBackend(torch.device("cpu")).video_reader(store, threads=2, streams=9) as r:
        assert isinstance(r, VideoReader) and r.threads == 2
    with nv.video_reader(store, prefix="projects/p", threads=2, streams=3) as r:  # no GPU yet
        assert isinstance(r, GpuVideoReader) and r.streams == 3 and r.impl == "torch"
        assert r.device == torch.device("cuda", 0)


def test_warn_once_is_per_key():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert tg.warn_once("a", "first a")
        assert not tg.warn_once("a", "second a")
        assert tg.warn_once("b", "first b")
    assert [str(w.message) for w in rec] == ["first a", "first b"]


def _imports(module: str) -> set[str]:
    """Every treadle module ``module`` imports, function-level imports included."""
    import ast
    import importlib.util

    tree = ast.parse(open(importlib.util.find_spec(module).origin).read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.startswith("treadle")}


def test_gpu_warnings_have_their_own_module():
    """decode/reader warn through gpu.fallback; nothing below the backend imports it."""
    for module in (
        "treadle.gpu.nvdec_decode",
        "treadle.gpu.nvdec_reader",
        "treadle.gpu.yuv_to_tensor",
    ):
        assert "treadle.gpu.backend" not in _imports(module), module
    assert "treadle.gpu.fallback.warn_once" in _imports("treadle.gpu.nvdec_decode")
    assert tg.warn_once is backend.warn_once  # the names users import keep working
    assert tg.GpuFallbackWarning is backend.GpuFallbackWarning


@pytest.mark.parametrize(
    "module",
    [
        "treadle.video.cpu_decode",
        "treadle.video.cpu_reader",
        "treadle.video.fetch",
        "treadle.video.frame_spec",
    ],
)
def test_video_reads_import_nothing_above_video(module):
    """video sits below plan: the frame spec is video's, td.Video holds one."""
    above = [m for m in _imports(module) if m.split(".")[1] in ("plan", "read", "gpu", "torch")]
    assert above == [], module
