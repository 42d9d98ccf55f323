"""What the sample reader (:mod:`treadle.read.sample_reader`) may ask of a video reader and of a
decode backend: the CPU's :class:`~treadle.video.cpu_reader.VideoReader` and
:class:`~treadle.gpu.backend.CpuBackend`, NVDEC's
:class:`~treadle.gpu.nvdec_reader.GpuVideoReader` and :class:`~treadle.gpu.backend.NvdecBackend`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from treadle.storage import Store
    from treadle.video.fetch import FetchedWindow, WindowRequest


class VideoWindowReader(Protocol):
    """Reads batches of video windows (one output per request, in request order)."""

    fetches_ahead: bool
    """True when it is a :class:`FetchingVideoReader`: a batch's bytes can be fetched
    while an earlier batch decodes. False: :meth:`read` fetches and decodes together."""

    def read(self, requests: Sequence[WindowRequest]) -> list[Any]: ...

    def close(self) -> None: ...


class FetchingVideoReader(VideoWindowReader, Protocol):
    """A reader whose :meth:`read` is :meth:`fetch` then :meth:`decode`, callable apart."""

    def fetch(self, requests: Sequence[WindowRequest]) -> list[FetchedWindow]: ...

    def decode(self, windows: Sequence[FetchedWindow]) -> list[Any]: ...

    def submit(self, windows: Sequence[FetchedWindow]) -> Callable[[], list[Any]]:
        """:meth:`decode` started on the decode threads; the call returned waits for it."""
        ...


class VideoBackend(Protocol):
    """Where video decodes: its readers, and whether they write on :attr:`device`."""

    device: torch.device
    name: str

    @property
    def on_device(self) -> bool: ...

    def video_reader(
        self, store: Store, *, prefix: str = "", threads: int = 1
    ) -> VideoWindowReader: ...
