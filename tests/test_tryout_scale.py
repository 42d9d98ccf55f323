"""A new user's tryout of block shuffles, the lookahead, ``treadle simulate`` and image
columns: each test failed before its fix."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
from PIL import Image

import treadle as td
from treadle.cli import main

_SIM = ["simulate", "synthetic:oxe", "--nodes", "2", "--ranks-per-node", "2", "--cache-bytes",
        "4T", "--bandwidth", "3G", "--latency", "30ms", "--steps", "3", "--sample-nodes", "1",
        "--batch-per-rank", "2"]  # fmt: skip


@pytest.mark.parametrize("rate", ["-5", "0", "nan", "inf"])
def test_simulate_refuses_a_rank_rate_that_is_not_positive(rate, capsys):
    with pytest.raises(SystemExit):  # it printed negative and nan samples/s and GET/s
        main([*_SIM, f"--rank-rate={rate}"])
    assert "--rank-rate" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--block-rows", "64"], ["--partitions", "4"],
                                  ["--window-blocks", "2"]])  # fmt: skip
def test_simulate_refuses_block_options_without_shuffle_block(flag, capsys):
    assert main([*_SIM, *flag]) == 1  # they were ignored: a full permutation was walked
    err = capsys.readouterr().err
    assert flag[0] in err and "--shuffle block" in err


def test_simulate_refuses_a_run_shorter_than_its_windows(capsys):
    assert main([*_SIM, "--windows", "3", "--run-steps", "2"]) == 1  # walked 0..2 three times
    assert "--run-steps 2" in capsys.readouterr().err


@pytest.fixture(scope="module")
def arm(tmp_path_factory):
    """A local table of 6 episodes of 20 moments (an action each)."""
    client = td.Client(str(tmp_path_factory.mktemp("store")))
    table = client.project("p").branch("main").table("arm")
    rng = np.random.default_rng(0)
    for e in range(6):
        table.append_episode({"action": rng.random((20, 2)).astype("float32")},
                             episode=f"ep{e}", fps=10)  # fmt: skip
    return table


def test_lookahead_on_a_local_root_says_it_does_nothing(arm, caplog):
    recipe = td.Recipe(seed=1, batch_size=6, components=[td.Component(arm)],
                       shuffle=td.BlockShuffle(block_rows=7))  # fmt: skip
    loader = td.TrainLoader(recipe, steps=2, lookahead=4)
    with caplog.at_level(logging.WARNING, logger="treadle"):
        assert len(list(loader)) == 2
    # a stage ran and td.info() reported its hit rate 1.0 over no chunks at all
    assert getattr(loader, "lookahead_stage", None) is None
    assert "lookahead=4 has no effect" in caplog.text


def _jpeg(a: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(a).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_an_odd_size_resizes_an_image_column_and_is_refused_on_a_video_column(tmp_path):
    """Pillow resizes to any size; only video columns (YUV 4:2:0) need even ones (td.Video
    refused size=(15, 17) for image columns too, which docs/api.md does not say)."""
    branch = td.Client(str(tmp_path)).project("p").branch("main")
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (25, 33, 3), np.uint8) for _ in range(4)]
    shots = branch.table("shots")
    shots.append_episode({"image": [_jpeg(a) for a in images]}, episode="e", fps=10)
    spec = td.Windows({"image": td.Video([0], size=(15, 17))})
    recipe = td.Recipe(seed=0, batch_size=2, components=[td.Component(shots, spec)])
    batch = next(iter(td.TrainLoader(recipe, steps=1)))
    for k, frame in enumerate(batch["_frame"].tolist()):
        want = Image.open(io.BytesIO(_jpeg(images[frame]))).convert("RGB")
        want = np.asarray(want.resize((17, 15), Image.BILINEAR))
        np.testing.assert_array_equal(batch["image"][k, 0].numpy(), want)
    with branch.transaction("write") as tx:
        clip = rng.integers(0, 255, (4, 16, 16, 3), np.uint8)
        tx.table("cams").append_episode({"cam": td.VideoFrames(clip, fps=10)}, episode="e")
    spec = td.Windows({"cam": td.Video([0], size=(15, 17))})
    with pytest.raises(td.PlanError, match=r"video column 'cam'.*even size=\(H, W\)"):
        td.Recipe(
            seed=0, batch_size=2, components=[td.Component(branch.table("cams"), spec)]
        ).plan()
