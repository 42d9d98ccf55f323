"""treadle.video: H.264 video columns.

Write: :func:`encode_value` turns a :class:`VideoFrames` / :class:`VideoFile` into an
:class:`EncodedStream` (Annex-B bytes + per-frame index); :func:`index_to_arrow` makes
the column's rows. Read: :class:`WindowFetcher` plans, fetches and (with
:meth:`FetchedWindow.verify`) verifies batches of :class:`WindowRequest`, which
:class:`VideoReader` (and the GPU reader) decode into the arrays a :class:`FrameSpec`
describes. Colour: each window is converted with its own stream's matrix and range,
recorded in the index; untagged streams are BT.601 limited range
(:mod:`treadle.video.colour_tags`).
"""

from treadle.video.column_layout import index_from_arrow, index_to_arrow, video_struct_type
from treadle.video.cpu_decode import RESIZE_INTERPOLATION, finish_window
from treadle.video.cpu_reader import VideoReader
from treadle.video.encode import encode_frames, encode_value, from_container
from treadle.video.fetch import FetchedWindow, ReadStats, WindowFetcher, WindowRequest
from treadle.video.frame_spec import FrameSpec
from treadle.video.stream import COLOUR_TAGS, EncodedStream, StreamIndex, StreamMeta
from treadle.video.values import VideoFile, VideoFrames
from treadle.video.window_plan import WindowPlan, plan_window

__all__ = [
    "COLOUR_TAGS",
    "RESIZE_INTERPOLATION",
    "EncodedStream",
    "FetchedWindow",
    "FrameSpec",
    "ReadStats",
    "StreamIndex",
    "StreamMeta",
    "VideoFile",
    "VideoFrames",
    "VideoReader",
    "WindowFetcher",
    "WindowPlan",
    "WindowRequest",
    "encode_frames",
    "encode_value",
    "finish_window",
    "from_container",
    "index_from_arrow",
    "index_to_arrow",
    "plan_window",
    "video_struct_type",
]
