"""What a LeRobot import did with each episode's video: copied or re-encoded, and why.

:class:`VideoCodecs` reads each source video file's codec once (the container header only,
no demux) and turns an episode's video values into :attr:`ImportResult.videos` rows:
a ``td.VideoFile`` of H.264 is copied (its packets stored as they are, bit-exact); a
``td.VideoFile`` of another codec, or ``td.VideoFrames`` (a v3.0 span decoded), is
re-encoded to H.264 once, at import (lossy: LeRobot's AV1 re-encoded measured 1.1-1.2 dB
PSNR below LeRobot's own decode of the source).
"""

from __future__ import annotations

from typing import Any

import av

from treadle.errors import CorruptData
from treadle.importers.arrow import column_name
from treadle.video import VideoFile, VideoFrames
from treadle.video.media_open import open_media

__all__ = ["VideoCodecs"]

_NOT_ALONE = (
    "its H.264 packets do not decode to the source's frames on their own (the span does not "
    "start on a keyframe, has open-GOP leading pictures, or its last B-frames reference the "
    "next episode's pictures)"
)


class VideoCodecs:
    """Per source video file, its codec (read once); per episode, the report rows."""

    def __init__(self, source: Any):
        self.source = source
        self._codecs: dict[str, str] = {}

    def codec(self, name: str) -> str:
        """The codec of source video file ``name`` (``"h264"``, ``"av1"``, ...)."""
        if name not in self._codecs:
            try:
                data: Any = (
                    str(self.source.local_path(name))
                    if not self.source.url
                    else self.source.read(name)
                )
                with open_media(data, self.source.describe(name)) as c:
                    codec = c.streams.video[
                        0
                    ].codec_context.codec  # canonical: "av1", not "libdav1d"
                    self._codecs[name] = getattr(codec, "canonical_name", codec.name)
            except (av.error.FFmpegError, IndexError) as e:
                raise CorruptData(f"{self.source.describe(name)}: cannot read video: {e}") from None
        return self._codecs[name]

    def report(
        self, episode: str, ep: Any, cols: dict[str, Any], meta: Any, rename: Any
    ) -> list[dict[str, str]]:
        """``{"episode", "column", "video", "why"}`` for each camera of one episode."""
        out = []
        for cam in meta.cameras:
            column = column_name(cam, f"LeRobot episode {ep.index}", rename)
            value = cols.get(column)
            codec = self.codec(ep.video_files[cam])
            if isinstance(value, VideoFile) and codec == "h264":
                video, why = "copied", "H.264 packets stored as they are (bit-exact)"
            elif codec != "h264":
                video, why = "re-encoded", f"source codec is {codec}; tables store H.264"
            elif isinstance(value, VideoFrames):
                video, why = "re-encoded", _NOT_ALONE
            else:
                continue  # not a video value (cannot happen for a camera): nothing to say
            out.append({"episode": episode, "column": column, "video": video, "why": why})
        return out
