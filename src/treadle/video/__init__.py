"""treadle.video: H.264 video columns.

Write: :func:`encode_value` turns a :class:`VideoFrames` / :class:`VideoFile` into an
:class:`EncodedStream` (Annex-B bytes + per-frame index); :func:`index_to_arrow` makes
the column's rows. Read: :class:`VideoReader` plans, fetches, verifies and decodes
batches of :class:`WindowRequest`. Colour: each window is converted with its own
stream's matrix and range, recorded in the index; untagged streams are BT.601 limited
range (:mod:`treadle.video.colour`).
"""

from treadle.video.decode import RESIZE_INTERPOLATION, finish_window
from treadle.video.encode import encode_frames, encode_value, from_container
from treadle.video.layout import (
    VIDEO_FIELD_METADATA,
    index_from_arrow,
    index_to_arrow,
    is_video_field,
    video_field,
    video_struct_type,
)
from treadle.video.reader import ReadStats, VideoReader, WindowRequest
from treadle.video.stream import COLOUR_TAGS, EncodedStream, StreamIndex, StreamMeta
from treadle.video.values import VideoFile, VideoFrames
from treadle.video.window import WindowPlan, plan_window

__all__ = [
    "COLOUR_TAGS",
    "RESIZE_INTERPOLATION",
    "VIDEO_FIELD_METADATA",
    "EncodedStream",
    "ReadStats",
    "StreamIndex",
    "StreamMeta",
    "VideoFile",
    "VideoFrames",
    "VideoReader",
    "WindowPlan",
    "WindowRequest",
    "encode_frames",
    "encode_value",
    "finish_window",
    "from_container",
    "index_from_arrow",
    "index_to_arrow",
    "is_video_field",
    "plan_window",
    "video_field",
    "video_struct_type",
]
