"""A user's video file opened with FFmpeg: a video, never a playlist naming other files.

FFmpeg's playlist demuxers (HLS, concat, DASH, IMF) open the files or URLs written in the
file they are given: a ``clip.m3u8`` among a dataset's videos would bring any local video
(``/home/...``), or one fetched from the network, into a table. :func:`open_media` lets
nested opens use local files only (no network) and refuses a playlist once it is opened.
"""

from __future__ import annotations

import io
import os
from typing import Any

import av

from treadle.errors import VideoError

#: demuxers that open other files or URLs by the names written in the file
PLAYLISTS = frozenset({"hls", "applehttp", "concat", "dash", "imf", "webm_dash_manifest"})


def open_media(source: str | os.PathLike[str] | bytes, label: str) -> Any:
    """The PyAV container of ``source`` (a path or the file's bytes); FFmpeg's errors
    propagate, a playlist is :class:`VideoError` naming ``label``."""
    target = io.BytesIO(source) if isinstance(source, bytes) else os.fspath(source)
    container = av.open(target, options={"protocol_whitelist": "file,pipe"})
    name = container.format.name if container.format else ""
    if PLAYLISTS & set(name.split(",")):
        container.close()
        raise VideoError(
            f"video {label} is a {name} playlist, which names other files to read: give "
            "the video file itself"
        )
    return container
