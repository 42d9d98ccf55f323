"""How far a stream's frame times are from the constant-rate grid its table is read on.

A table's rows are moments at its fps and a video's display frame ``k`` is row ``k``
(whatever its timestamp), so a window in seconds is converted to frame offsets with the
fps alone. That is exact only for a constant-rate stream: a variable-frame-rate file
(phone or screen recordings) shows frame ``k`` at its own timestamp, not at ``k / fps``.
:func:`grid_deviation` measures, at write time, the largest distance in seconds between a
frame's time (from the first frame's) and ``k / fps``, less the rounding of the
container's time base (an MKV's milliseconds put a 30 fps frame up to 0.5 ms off a grid it
is on); the table records it (:mod:`treadle.table.off_grid`) and a plan refuses windows in
seconds over a stream further off than their ``tolerance_s``.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

#: Deviations below this (float rounding of the grid) are recorded as 0.
NEGLIGIBLE_S = 1e-9


def grid_deviation(
    ticks: np.ndarray, time_base: Fraction | None, fps: float, *, own_rate: bool = False
) -> float:
    """The largest ``|t_k - k / fps|`` in seconds over frames ``k`` shown at ``ticks``
    (display order, in ``time_base`` units), ``t`` from the first frame, less half a tick.

    ``own_rate``: the rate was given by the writer, not taken from the file (a
    ``VideoFile(..., fps=)``), so the file's own even spacing counts as on the grid: its
    times are measured against its mean frame spacing and scaled to ``1 / fps`` per frame.
    0 when ``time_base`` is unknown or there are fewer than two frames.
    """
    n = len(ticks)
    if n < 2 or not time_base or not fps > 0:
        return 0.0
    t = (np.asarray(ticks, np.int64) - int(ticks[0])).astype(np.float64) * float(time_base)
    half_tick = float(time_base) / 2
    if own_rate:
        step = t[-1] / (n - 1)
        if not step > 0:
            return 0.0
        scale = (1.0 / fps) / step  # file seconds -> table seconds
        t, half_tick = t * scale, half_tick * scale
    dev = float(np.abs(t - np.arange(n, dtype=np.float64) / fps).max()) - half_tick
    return float(dev) if dev > NEGLIGIBLE_S else 0.0
