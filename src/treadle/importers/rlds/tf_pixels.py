"""JPEG pixels as TFDS gives them (``pixels="tfds"``): libjpeg-turbo's fast integer IDCT.

TFDS decodes ``Image`` features with ``tf.io.decode_jpeg``'s defaults: libjpeg(-turbo)'s
fast integer IDCT (``JDCT_IFAST``) with fancy upsampling. Pillow (treadle's decoder) uses the
accurate IDCT, equal to ``dct_method="INTEGER_ACCURATE"``; the two differ by up to ~15 levels
on most values. A model trained through ``tf.data`` saw the fast decode's pixels, so to
reproduce one (OpenVLA, Octo) the frames stored with ``images="decoded"`` or ``"video"`` can
be decoded the same way: ``simplejpeg`` (libjpeg-turbo bundled in its wheel) with
``fastdct=True, fastupsample=False``. Measured equal to TF 2.21's default decode, every pixel,
on the test fixtures' JPEGs (TFDS's own encoder) and on 4:2:0 JPEGs from TF and Pillow at
quality 75-95; the tests compare against TF's pixels committed with the fixtures.

Other formats (PNG) are lossless: every decoder gives the same pixels, so Pillow decodes them.
A JPEG whose header claims more than :data:`MAX_PIXELS` pixels is refused before decoding.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from treadle.errors import CorruptData, MissingDependency, UnsafeInput
from treadle.importers.images import decode_image
from treadle.importers.rlds.tfrecord import RLDS_INSTALL

#: the largest JPEG decoded (Pillow's own decompression-bomb limit, 2 x 89.5 M pixels)
MAX_PIXELS = 2 * 89_478_485


def _simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError as e:
        raise MissingDependency(
            f"pixels='tfds' needs the 'simplejpeg' package, which is not installed ({e}); "
            f"install it with: {RLDS_INSTALL}"
        ) from None
    return simplejpeg


def decode_like_tfds(data: bytes, channels: int, where: str) -> np.ndarray:
    """``uint8 [H, W, channels]``: a JPEG as ``tf.io.decode_jpeg`` decodes it by default
    (other formats as Pillow does, which is the same for lossless ones)."""
    if not bytes(data[:2]) == b"\xff\xd8":
        pixels = decode_image(data, "", where)
        return pixels[..., None] if pixels.ndim == 2 else pixels
    sj = _simplejpeg()
    try:
        height, width, _, _ = sj.decode_jpeg_header(data)
        if height * width > MAX_PIXELS:
            raise UnsafeInput(f"{where}: a {width}x{height} JPEG is over {MAX_PIXELS} pixels")
        colour = "GRAY" if channels == 1 else "RGB"
        pixels = sj.decode_jpeg(data, colorspace=colour, fastdct=True, fastupsample=False)
    except ValueError as e:
        raise CorruptData(f"{where}: cannot decode JPEG: {e}") from None
    return pixels if pixels.ndim == 3 else pixels[..., None]
