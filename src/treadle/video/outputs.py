"""Where a window's decoded frames go: the logic every decode loop shares.

A decoder outputs frames in display order, some of them warm-up (decoded only because a
wanted frame references them). :class:`WindowOutputs` matches each output frame to the
output positions it fills by its pts (a frame wanted twice fills two positions: the first
is converted into, the others copied from it), checks a wanted frame's size against the
episode's index (a frame of another size would be resized silently), and at the end that
every wanted frame came out. The native loop (:mod:`treadle.video.native`), PyAV's loop
(:mod:`treadle.video.cpu_decode`) and NVDEC's (:mod:`treadle.gpu.nvdec_decode`) all use it, so a
fix to any of these rules lands once.
"""

from __future__ import annotations

from typing import Any

from treadle.errors import CorruptData
from treadle.video.window_plan import WindowPlan


class WindowOutputs:
    """The output positions of one decode of ``plan``'s window (one per decode).

    ``source``: the (height, width) the episode's index gives every frame (``None``: not
    checked); ``where`` names the window in errors.
    """

    def __init__(self, plan: WindowPlan, where: str, source: tuple[int, int] | None = None):
        self.plan = plan
        self.where = where
        self.source = source
        self._pending = plan.slots()

    def take(self, pts: int) -> list[int] | None:
        """The output positions the frame of ``pts`` fills, the one to convert into first;
        ``None`` for a warm-up frame (before the window in decode or display order), which
        the caller drops. Each wanted pts is given once."""
        return self._pending.pop(pts, None)

    def size_ok(self, width: int, height: int) -> bool:
        """Whether a wanted frame of ``width`` x ``height`` is the index's size."""
        return self.source is None or (height, width) == self.source

    def check_size(self, positions: list[int], width: int, height: int) -> None:
        """Raise :class:`CorruptData` naming the frame unless it is the index's size."""
        if self.source is not None and (height, width) != self.source:
            h, w = self.source
            raise CorruptData(
                f"{self.where} frame {int(self.plan.wanted[positions[0]])}: decodes to "
                f"{width}x{height}, the episode's index says {w}x{h}"
            )

    @staticmethod
    def copy_repeats(out: Any, positions: list[int]) -> None:
        """Fill a frame's other positions from its first (already written)."""
        for j in positions[1:]:
            out[j] = out[positions[0]]

    def check_complete(self) -> None:
        """Raise :class:`CorruptData` naming the window when a wanted frame was not output."""
        self.plan.check_complete(self._pending, self.where)
