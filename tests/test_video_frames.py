"""FrameSpec: the one description of a window's output (td.Video, CPU and GPU decoders)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import treadle as td
from treadle.errors import PlanError, VideoError
from treadle.video.frame_spec import DTYPES, FrameSpec

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_shape_by_layout_and_size():
    assert FrameSpec().shape(4, 48, 64) == (4, 48, 64, 3)
    assert FrameSpec(layout="TCHW").shape(4, 48, 64) == (4, 3, 48, 64)
    assert FrameSpec((24, 32), "TCHW").shape(2, 480, 640) == (2, 3, 24, 32)
    assert FrameSpec((24, 32)).size_for(480, 640) == (24, 32)
    assert FrameSpec().size_for(35, 51) == (35, 51)  # native odd sizes are the stream's


@pytest.mark.parametrize("dtype", DTYPES)
def test_allocate_host_and_device(dtype):
    spec = FrameSpec((24, 32), "TCHW", dtype)
    host = spec.allocate(3, 48, 64)
    if dtype == "bfloat16":  # numpy has no bfloat16: a CPU torch tensor
        assert isinstance(host, torch.Tensor) and host.dtype == torch.bfloat16
    else:
        assert isinstance(host, np.ndarray) and host.dtype == np.dtype(dtype)
    assert tuple(host.shape) == (3, 3, 24, 32)
    dev = spec.allocate(3, 48, 64, batch=5, device="cpu")
    assert isinstance(dev, torch.Tensor) and tuple(dev.shape) == (5, 3, 3, 24, 32)
    assert dev.dtype == spec.torch_dtype
    spec.check(host, 3, 48, 64)  # what it allocates, it accepts
    spec.check(dev[0], 3, 48, 64, device="cpu")


def test_check_names_the_window_and_what_it_needs():
    spec = FrameSpec(dtype="float32")
    spec.check(torch.empty(2, 48, 64, 3), 2, 48, 64)
    with pytest.raises(VideoError, match=r"^w: out is \(2, 48, 64, 3\) uint8, the window needs"):
        spec.check(np.empty((2, 48, 64, 3), np.uint8), 2, 48, 64, "w")
    with pytest.raises(VideoError, match=r"needs \(3, 48, 64, 3\) float32$"):
        spec.check(np.empty((2, 48, 64, 3), np.float32), 3, 48, 64, "w")
    with pytest.raises(VideoError, match="numpy array or a CPU torch tensor, got list"):
        spec.check([], 2, 48, 64, "w")
    with pytest.raises(VideoError, match="a torch tensor, got ndarray"):  # device outputs
        spec.check(np.empty((2, 48, 64, 3), np.float32), 2, 48, 64, "w", device="cpu")
    with pytest.raises(VideoError, match="on meta.*needs .* on cpu"):
        spec.check(torch.empty(2, 48, 64, 3, device="meta"), 2, 48, 64, "w", device="cpu")
    bf16 = FrameSpec(dtype="bfloat16")
    with pytest.raises(VideoError, match="out is"):  # numpy cannot hold bfloat16
        bf16.check(np.empty((2, 48, 64, 3), np.float32), 2, 48, 64)


def test_float_levels_are_q_over_255_exactly():
    """Float output is ``torch.tensor(q, float32) / 255`` (LeRobot's ``x / 255``), not
    ``q * float32(1/255)`` (1 ulp off for 126 of the 256 levels), and torchvision's
    ``Normalize`` of that with mean/std."""
    q = torch.arange(256, dtype=torch.float32)
    want = torch.tensor(np.arange(256), dtype=torch.float32) / 255
    assert int((q * torch.tensor(1 / 255, dtype=torch.float32) != want).sum()) == 126
    for dtype in ("float32", "float16", "bfloat16"):
        levels = FrameSpec(dtype=dtype).levels()
        assert levels.dtype == torch.float32 and levels.shape == (3, 256)
        assert all(torch.equal(levels[c], want) for c in range(3))
    levels = FrameSpec(dtype="float32", mean=MEAN, std=STD).levels()
    for c in range(3):
        m, s = torch.tensor(MEAN[c]), torch.tensor(STD[c])
        assert torch.equal(levels[c], (want - m) / s)
    x = torch.randint(0, 256, (2, 5, 7, 3), dtype=torch.uint8)
    out = FrameSpec(dtype="float32", mean=MEAN, std=STD).normalise_(x.float(), 3)
    mean, std = torch.tensor(MEAN), torch.tensor(STD)
    assert torch.equal(out, (x.float() / 255 - mean) / std)


def test_affine_is_the_normalisation_in_float32():
    scale, shift = FrameSpec(dtype="float32", mean=MEAN, std=STD).affine()
    q = np.arange(256, dtype=np.float32)
    for c in range(3):
        got = q * np.float32(scale[c]) + np.float32(shift[c])
        np.testing.assert_allclose(got, (q / 255 - MEAN[c]) / STD[c], rtol=0, atol=1e-6)
    assert FrameSpec(dtype="float16").affine() == ((np.float32(1 / 255),) * 3, (0.0,) * 3)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"layout": "HWC"}, "layout must be one of"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"mean": MEAN}, "mean needs a float dtype"),
        ({"dtype": "float32", "std": (1.0, 0.0, 1.0)}, r"std must be 3 numbers \(std > 0\)"),
        ({"dtype": "float32", "mean": (1.0, 2.0)}, "mean must be 3 numbers"),
        ({"size": (0, 4)}, "size must be positive"),
        ({"size": "big"}, r"size must be \(height, width\)"),
    ],
)
def test_invalid_specs_are_refused(kw, match):
    with pytest.raises(VideoError, match=match):
        FrameSpec(**kw)


def test_td_video_has_its_frame_spec_and_keeps_its_own_errors():
    v = td.Video(range(4), size=[24, 32], layout="TCHW", dtype="float32", mean=MEAN, std=STD)
    assert v.frame == FrameSpec((24, 32), "TCHW", "float32", MEAN, STD)
    assert (v.size, v.layout, v.dtype, v.mean, v.std) == ((24, 32), "TCHW", "float32", MEAN, STD)
    assert FrameSpec.of(v) is v.frame and FrameSpec.of(v.frame) is v.frame
    assert v.at_fps(30.0, "x").frame == v.frame
    assert td.Video(range(4)) == td.Video(range(4)) and hash(td.Video(0)) == hash(td.Video(0))
    with pytest.raises(PlanError, match=r"^Video layout must be one of \('THWC', 'TCHW'\)"):
        td.Video(range(4), layout="HWC")
    with pytest.raises(PlanError, match="^Video mean needs a float dtype"):
        td.Video(range(4), mean=MEAN)
    with pytest.raises(PlanError, match="^Video size must be positive"):
        td.Video(range(4), size=(0, 32))  # odd sizes: refused by the plan on a video column
