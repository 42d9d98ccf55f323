"""Window planning (pure): which bytes and packets a set of display frames needs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treadle.errors import CorruptData, VideoError
from treadle.video.stream import StreamIndex


@dataclass(frozen=True, eq=False)
class WindowPlan:
    """The byte range ``[start, end)`` of the stream and the packets to decode in it.

    ``frames`` are the packets' display indices in decode order; ``rel_offset`` their
    offsets relative to ``start``; ``pts`` their timestamps. ``wanted_pts[j]`` is the
    pts of output frame ``j`` (in the caller's order); ``wanted`` the display indices.
    """

    start: int
    end: int
    frames: np.ndarray  # int64, display index per packet, decode order
    rel_offset: np.ndarray  # int64
    size: np.ndarray  # int64
    pts: np.ndarray  # int64
    wanted: np.ndarray  # int64, display indices, output order
    wanted_pts: np.ndarray  # int64, output order

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def num_packets(self) -> int:
        return len(self.frames)

    def slots(self) -> dict[int, list[int]]:
        """pts -> the output positions it fills (a decoder pops each frame it outputs)."""
        out: dict[int, list[int]] = {}
        for j, p in enumerate(self.wanted_pts.tolist()):
            out.setdefault(p, []).append(j)
        return out

    def check_complete(self, slots: dict[int, list[int]], where: str) -> None:
        """Raise :class:`CorruptData` naming ``where`` when a wanted frame was not output
        (``slots`` is what :meth:`slots` gave, less the frames decoded)."""
        if slots:
            missing = sorted(int(self.wanted[j]) for js in slots.values() for j in js)
            raise CorruptData(
                f"{where} frame {missing[0]}: decoder produced no picture for frame(s) "
                f"{missing[:8]}"
            )


def plan_window(index: StreamIndex, frames: np.ndarray | list[int] | range) -> WindowPlan:
    """Plan the read and decode of display ``frames`` (any order, no repeats needed).

    The range starts at the keyframe at or before (in decode order) the first packet the
    frames need, one GOP earlier if a wanted frame is an open-GOP leading frame of that
    keyframe (displayed before it, decoded after it), and ends with the largest
    decode-order packet needed. Packets are contiguous in decode order in the stream.
    """
    wanted = np.asarray(frames, dtype=np.int64).reshape(-1)
    n = len(index)
    if len(wanted) == 0:
        raise VideoError("video window asks for no frames")
    if wanted.min() < 0 or wanted.max() >= n:
        bad = wanted[(wanted < 0) | (wanted >= n)][0]
        raise VideoError(f"video frame {int(bad)} is outside the episode (0..{n - 1})")
    dod = index.display_of_decode
    keys = index.key_decode_positions
    dec = np.asarray(index.decode, dtype=np.int64)[wanted]
    dmin, dmax = int(dec.min()), int(dec.max())
    k = int(np.searchsorted(keys, dmin, side="right")) - 1  # keys[0] == 0, so k >= 0
    if k > 0 and (wanted < dod[keys[k]]).any():
        k -= 1  # open GOP: a leading frame references the previous GOP
    first = int(keys[k])
    order = dod[first : dmax + 1]
    offsets = np.asarray(index.offset, dtype=np.int64)[order]
    sizes = np.asarray(index.size, dtype=np.int64)[order]
    start = int(offsets[0])
    end = int(offsets[-1] + sizes[-1])
    if len(order) > 1 and (offsets[1:] != offsets[:-1] + sizes[:-1]).any():
        raise VideoError("video index: packets are not contiguous in decode order")
    return WindowPlan(
        start=start,
        end=end,
        frames=order,
        rel_offset=offsets - start,
        size=sizes,
        pts=np.asarray(index.pts, dtype=np.int64)[order],
        wanted=wanted,
        wanted_pts=np.asarray(index.pts, dtype=np.int64)[wanted],
    )
