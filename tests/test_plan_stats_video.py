"""``plan.stats(..., per_offset=True)`` on a video column: one per-channel statistic per
window offset (fields ``[T, channels]``), each over that offset's unpadded frames of the
sampled anchors, checked against numpy over every delivered window of a small plan."""

from __future__ import annotations

import numpy as np
import pytest

from test_plan_stats import _delivered, _plan, robots  # noqa: F401  (the module's fixture)


def test_video_per_offset_is_per_window_offset(robots):  # noqa: F811
    plan = _plan(robots)
    whole = plan.stats(["cam"], frames=10_000)["cam"]  # more than every window: all of them
    cam = plan.stats(["cam"], per_offset=True, frames=10_000)["cam"]
    assert cam.video and cam.mean.shape == cam.q01.shape == (2, 3) and cam.count.shape == (2, 3)
    shares = [float(w) for w in plan.weights]
    batches = _delivered(plan, [0, 1])  # the 14-D robot has no camera: never counted
    for t in range(2):
        vals, wts = [], []
        for c, b in batches:
            keep = ~np.asarray(b["cam_is_pad"])[:, t]
            px = np.asarray(b["cam"])[:, t][keep].reshape(-1, 3).astype(np.float64)
            vals.append(px)
            wts.append(np.full(len(px), shares[c] / plan.eligible(c)))
        v, w = np.concatenate(vals), np.concatenate(wts)
        assert cam.count[t].tolist() == [len(v)] * 3
        for ch in range(3):
            mean = np.average(v[:, ch], weights=w)
            np.testing.assert_allclose(cam.mean[t, ch], mean, rtol=1e-12)
            std = np.sqrt(np.average((v[:, ch] - mean) ** 2, weights=w))
            np.testing.assert_allclose(cam.std[t, ch], std, rtol=1e-12)
            q = np.quantile(v[:, ch], 0.99, weights=w, method="inverted_cdf")
            assert cam.q99[t, ch] == q
            assert cam.min[t, ch] == v[:, ch].min() and cam.max[t, ch] == v[:, ch].max()
    # the offsets together are the pooled statistic (count-weighted within a component)
    assert int(cam.count[:, 0].sum()) == int(whole.count) and cam.samples == whole.samples
    np.testing.assert_array_equal(cam.min.min(axis=0), whole.min)
    lr = cam.to_lerobot()
    assert lr["mean"].shape == (2, 3, 1, 1) and lr["count"].tolist() == [cam.samples]
    by = plan.stats(["cam"], per_offset=True, frames=10_000, by_component=True)
    assert by["arm4"]["cam"].mean.shape == (2, 3) and "cam" not in by["aloha"]


@pytest.mark.parametrize("per_offset", [False, True])
def test_video_per_offset_is_kept_apart(robots, per_offset):  # noqa: F811
    """A second call reads back what the first computed, each shape its own."""
    plan = _plan(robots)
    first = plan.stats(["cam"], per_offset=per_offset, frames=500)["cam"]
    again = plan.stats(["cam"], per_offset=per_offset, frames=500)["cam"]
    assert first.mean.shape == again.mean.shape == ((2, 3) if per_offset else (3,))
    np.testing.assert_array_equal(first.mean, again.mean)
