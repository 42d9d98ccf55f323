"""Camera frames stored as their own encoded bytes (JPEG, PNG, WebP): headers and decode.

Pillow is the reference decoder: an 8-bit frame is ``np.asarray(Image.open(b).convert("RGB"))``
(``"L"`` with ``channels=1``), and ``size=(H, W)`` is ``resize((W, H), Image.BILINEAR)`` of
that image, Pillow's own filter (not the YUV path video columns resize through). A 16-bit
grey PNG (depth) is never converted: its ``I;16`` values are the frame (``channels=1``),
resized with the same filter; a 16-bit RGB, RGBA or grey+alpha PNG, which Pillow reads as
8-bit, is refused. EXIF orientation is not applied (Pillow applies it only through
``exif_transpose``). Pillow's ``ImageFile.LOAD_TRUNCATED_IMAGES`` is held off while treadle
decodes (:func:`_strict`): a truncated image is an error, never grey rows.

:func:`image_header` reads a value's format, size and depth from its header (no decode);
:func:`decode_frame` decodes one value into one frame of a window's output, checking its
format and size against the column's first value and refusing a decompression bomb before
any pixel is decoded (:data:`MAX_PIXELS`). Errors are :class:`~treadle.errors.CorruptData`
naming the frame.
"""

from __future__ import annotations

import contextlib
import io
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from treadle.errors import CorruptData
from treadle.video.frame_spec import RAW16, FrameSpec

#: Decoded pixels one image may have (width x height): a header that promises more is a
#: possible decompression bomb, refused before decoding (about 200 MB of RGB).
MAX_PIXELS = 1 << 26

#: The encodings a ``td.Video`` image column may hold, by Pillow's format name.
FORMATS = ("JPEG", "PNG", "WEBP")
_DEPTH16 = ("I;16", "I;16B", "I;16L", "I")


def decoder_name() -> str:
    """The image decoder and its libraries' versions (``td.info()``)."""
    import PIL
    from PIL import features

    turbo = features.check_feature("libjpeg_turbo")
    jpeg = ("libjpeg_turbo", "libjpeg-turbo") if turbo else ("jpg", "libjpeg")
    libs = [f"{name} {features.version(key)}" for key, name in (jpeg, ("zlib", "zlib"),
            ("webp", "libwebp")) if features.version(key)]  # fmt: skip
    return f"Pillow {PIL.__version__} ({', '.join(libs)})"


def signature(data: bytes) -> str | None:
    """The image format the first bytes announce (``"JPEG"``, ``"PNG"``, ``"WEBP"``), or None."""
    head = bytes(data[:12])
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return None


@dataclass(frozen=True)
class ImageHeader:
    """What an encoded image's header says: format, size and whether it is 16-bit."""

    format: str
    width: int
    height: int
    depth16: bool = False

    @property
    def size(self) -> tuple[int, int]:
        """(height, width), as a frame spec's size."""
        return (self.height, self.width)


_PNG_COLOURS = {2: "RGB", 4: "grey+alpha", 6: "RGBA"}


def _png_ihdr(data: Any) -> tuple[int, int]:
    """A PNG's bit depth and colour type, from its IHDR chunk (always the first)."""
    head = bytes(data[12:26])
    return (head[12], head[13]) if len(head) == 14 and head[:4] == b"IHDR" else (0, -1)


_strict_lock = threading.Lock()
_strict_users = 0
_user_truncated = False  # the process's LOAD_TRUNCATED_IMAGES while treadle's decodes hold it


@contextlib.contextmanager
def _strict() -> Iterator[None]:
    """Pillow's ``ImageFile.LOAD_TRUNCATED_IMAGES`` off while treadle opens and decodes.

    Training scripts often set it (for other data sets); Pillow then fills what a truncated
    JPEG or PNG lacks with grey or zeros and skips PNG chunk CRCs: frames that are wrong
    without an error. The flag is one process global, so the decode threads count
    themselves in and the last one out restores the value the process had set."""
    from PIL import ImageFile

    global _strict_users, _user_truncated
    with _strict_lock:
        if ImageFile.LOAD_TRUNCATED_IMAGES:
            _user_truncated, ImageFile.LOAD_TRUNCATED_IMAGES = True, False
        _strict_users += 1
    try:
        yield
    finally:
        with _strict_lock:
            _strict_users -= 1
            if _strict_users == 0 and _user_truncated:
                _user_truncated, ImageFile.LOAD_TRUNCATED_IMAGES = False, True


def _open(data: Any, where: str) -> Any:
    from PIL import Image

    try:
        with warnings.catch_warnings():  # the bound below refuses bombs, not Pillow's warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=FORMATS)  # EPS: Ghostscript
    except Image.DecompressionBombError as e:
        raise CorruptData(f"{where}: refused, a possible decompression bomb ({e})") from None
    except Exception as e:  # Pillow raises many types for damaged bytes
        raise CorruptData(f"{where}: not a decodable image ({type(e).__name__}: {e})") from None
    if img.format not in FORMATS:
        raise CorruptData(f"{where}: a {img.format} image; image columns hold {FORMATS}")
    depth, colour = _png_ihdr(data) if img.format == "PNG" else (0, -1)
    if depth == 16 and img.mode not in _DEPTH16:  # Pillow keeps 16 bits of grey only
        raise CorruptData(
            f"{where}: a 16-bit {_PNG_COLOURS.get(colour, 'colour')} PNG, which "
            "Pillow reads as 8-bit (its low bytes lost); image columns take 16 bits only as "
            "single-channel grey PNGs (depth)"
        )
    w, h = img.size
    if w * h > MAX_PIXELS:
        raise CorruptData(
            f"{where}: refused, {w}x{h} is more than {MAX_PIXELS:,} pixels (a possible "
            "decompression bomb)"
        )
    return img


def image_header(data: Any, where: str) -> ImageHeader:
    """The header of one encoded image (nothing is decoded); :class:`CorruptData` naming
    ``where`` when it is not a JPEG/PNG/WebP Pillow opens, or it is over :data:`MAX_PIXELS`."""
    with _strict():
        img = _open(data, where)
    return ImageHeader(img.format, img.size[0], img.size[1], img.mode in _DEPTH16)


def decode_frame(data: Any, spec: FrameSpec, first: ImageHeader, where: str) -> np.ndarray:
    """One encoded image as the frame ``spec`` asks for before layout and dtype: ``uint8
    [H, W, C]`` (``uint16 [H, W, 1]`` for a 16-bit column), resized by Pillow when ``spec``
    has a size. ``first`` is the column's first image: a frame of another depth, or of
    another size when nothing resizes, is :class:`CorruptData` naming both; so is a
    truncated image, whatever Pillow's ``LOAD_TRUNCATED_IMAGES`` (:func:`_strict`)."""
    with _strict():
        return _decode(data, spec, first, where)


def _decode(data: Any, spec: FrameSpec, first: ImageHeader, where: str) -> np.ndarray:
    from PIL import Image

    img = _open(data, where)
    depth16 = img.mode in _DEPTH16
    if depth16 != first.depth16:
        bits = "16-bit" if depth16 else "8-bit"
        raise CorruptData(f"{where}: a {bits} image; the column's first image is not")
    if spec.size is None and (img.size[1], img.size[0]) != first.size:
        raise CorruptData(
            f"{where}: {img.size[0]}x{img.size[1]}, the column's first image is "
            f"{first.width}x{first.height} (give td.Video a size=(H, W) to resize them)"
        )
    try:
        if depth16:
            img = img.convert("I;16") if img.mode != "I;16" else img
        else:
            mode = "L" if spec.channels == 1 else "RGB"
            img = img.convert(mode) if img.mode != mode else img
        if spec.size is not None and img.size != (spec.size[1], spec.size[0]):
            img = img.resize((spec.size[1], spec.size[0]), Image.BILINEAR)
        pixels = np.asarray(img)
    except Exception as e:  # truncated or damaged data surfaces when pixels are decoded
        raise CorruptData(f"{where}: image does not decode ({type(e).__name__}: {e})") from None
    return pixels if pixels.ndim == 3 else pixels[:, :, None]


def write_frame(pixels: np.ndarray, spec: FrameSpec, out: Any) -> None:
    """Write one decoded frame (``[H, W, C]``) into ``out`` (one frame of a window) with
    ``spec``'s layout and dtype: 8-bit floats are ``x / 255`` then ``(x - mean) / std``
    (:meth:`FrameSpec.normalise_`, as for video), 16-bit floats the raw values."""
    if spec.layout == "TCHW":
        pixels = pixels.transpose(2, 0, 1)
    if isinstance(out, np.ndarray) and spec.dtype in ("uint8", RAW16):
        out[...] = pixels
        return
    import torch  # float (and bfloat16) frames only: workers of uint8 frames need none

    dst = out if isinstance(out, torch.Tensor) else torch.from_numpy(out)
    src = torch.from_numpy(np.array(pixels))  # a writable copy (Pillow's is read-only)
    if pixels.dtype == np.uint16:
        dst.copy_(src.to(torch.int32))  # raw depth values, no division
        return
    spec.store_(src, dst, 0 if spec.layout == "TCHW" else 2)
