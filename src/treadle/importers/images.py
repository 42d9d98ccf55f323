"""Image members and columns: the ``images`` option, and encoded bytes -> ``uint8`` pixels.

Pillow decodes when it is installed (the decoder WebDataset, MDS and ``datasets`` use);
otherwise FFmpeg (PyAV) decodes JPEG/PNG/WebP/BMP, the codec named by the extension or
sniffed from the first bytes.
"""

from __future__ import annotations

import io

import numpy as np

from treadle.errors import CorruptData, SchemaMismatch
from treadle.video.image_decode import signature


def check_images(images: str) -> None:
    """Refuse an ``images`` option other than ``"encoded"`` and ``"decoded"``."""
    if images not in ("encoded", "decoded"):
        raise ValueError(f"images must be 'encoded' or 'decoded', got {images!r}")


IMAGE_EXTS = {"jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "pbm", "pnm", "tif", "tiff"}
#: the formats Pillow may decode here: a source's bytes choose Pillow's plugin, whatever
#: their name, and others (EPS runs Ghostscript; rarely used plugins) are refused
PIL_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "PPM", "TIFF", "GIF")
_AV_CODEC = {"jpg": "mjpeg", "jpeg": "mjpeg", "png": "png", "webp": "webp", "bmp": "bmp"}


def decode_image(data: bytes, ext: str, where: str) -> np.ndarray:
    """Encoded image bytes -> ``uint8 [H, W, 3]`` RGB (``[H, W]`` kept for 8-bit grey).

    Pillow decodes when it is installed (the decoder WebDataset, MDS and ``datasets``
    use, so decoded pixels equal theirs exactly, JPEG included), only the
    :data:`PIL_FORMATS`; otherwise FFmpeg (PyAV, a treadle dependency) decodes
    JPEG/PNG/WebP/BMP.
    """
    ext = ext.lower().rsplit(".", 1)[-1]
    try:
        from PIL import Image
    except ImportError:
        Image = None  # noqa: N806
    if Image is not None:
        try:
            img = Image.open(io.BytesIO(bytes(data)), formats=PIL_FORMATS)
            img = img.convert("L" if img.mode in ("L", "1") else "RGB")
            return np.asarray(img)
        except MemoryError:
            raise  # not the image's fault: a corrupt-data error would hide it
        except Image.UnidentifiedImageError:
            raise CorruptData(
                f"{where}: cannot decode {ext or 'image'}: not a {', '.join(PIL_FORMATS)} image"
            ) from None
        except Exception as e:
            raise CorruptData(f"{where}: cannot decode {ext or 'image'}: {e}") from None
    codec = _AV_CODEC.get(ext) or _sniff(data)
    if codec is None:
        raise SchemaMismatch(f"{where}: decoding .{ext} images needs Pillow")
    import av

    try:
        ctx = av.CodecContext.create(codec, "r")
        frames = ctx.decode(av.Packet(bytes(data)))
        if not frames:
            frames = ctx.decode(None)
        frame = frames[0]
        if frame.format.name in ("gray", "gray8"):
            return frame.to_ndarray()
        return frame.to_ndarray(format="rgb24")
    except Exception as e:  # FFmpeg errors are many types
        raise CorruptData(f"{where}: cannot decode {ext or 'image'}: {e}") from None


def _sniff(data: bytes) -> str | None:
    """FFmpeg's decoder for the format the first bytes announce (the loader's signature)."""
    return _BY_SIGNATURE.get(signature(data) or "")


_BY_SIGNATURE = {"JPEG": "mjpeg", "PNG": "png", "WEBP": "webp"}


def decoded_bytes(data: bytes) -> int:
    """The bytes ``data`` (an encoded image) takes decoded to ``uint8 [H, W, 3]``, from its
    header alone; ``len(data)`` when the header does not say (the decode will)."""
    try:
        from PIL import Image

        with Image.open(io.BytesIO(bytes(data))) as img:
            w, h = img.size
    except Exception:  # not an image Pillow reads (or a bomb it refuses): the decode says why
        return len(data)
    return max(len(data), w * h * 3)
