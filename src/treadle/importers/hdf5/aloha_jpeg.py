"""ALOHA's compressed cameras: one JPEG per frame, zero-padded into a ``uint8`` array.

ALOHA's recorder (``record_episodes.py`` of the aloha / act repositories, with
``COMPRESS = True``) sets the file's root attribute ``compress``, encodes each frame with
``cv2.imencode(".jpg", ...)``, pads every frame with zeros to the longest one and stores
``/observations/images/<cam>`` as ``uint8 [N, padded]``, with ``/compress_len``
``[n_cams, N]`` holding each frame's byte length (one row per camera, in the order the
recorder listed its cameras, which the file does not say).

:func:`jpeg_frames` cuts each frame's bytes out: with ``compress_len``, by the row that fits
the camera (every frame starts with JPEG's ``FF D8``, ends with its end marker ``FF D9`` at
its length, and only zeros follow); without it, where the zero padding starts (a JPEG's last byte is ``D9``). A
frame that fits neither is :class:`~treadle.errors.CorruptData` naming the camera and the
frame: bytes are never guessed.
"""

from __future__ import annotations

import numpy as np

from treadle.errors import CorruptData

#: where ALOHA keeps its cameras, and the dataset of the compressed frames' lengths
IMAGES = "observations/images/"
LENGTHS = "compress_len"
_EOI = b"\xff\xd9"


def is_packed_camera(path: str, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """A camera of a compressed ALOHA file: ``uint8 [N, padded]`` under the images group."""
    return path.startswith(IMAGES) and len(shape) == 2 and np.dtype(dtype) == np.uint8


def _fits(padded: np.ndarray, lengths: np.ndarray) -> bool:
    """Every frame ends with ``FF D9`` at its length and is zeros after it."""
    if lengths.shape != (padded.shape[0],) or lengths.min(initial=2) < 2:
        return False
    if lengths.max(initial=0) > padded.shape[1]:
        return False
    rows = np.arange(padded.shape[0])
    ends = np.all(padded[rows, lengths - 2] == 0xFF) and np.all(padded[rows, lengths - 1] == 0xD9)
    starts = np.all(padded[:, 0] == 0xFF) and np.all(padded[:, 1] == 0xD8)
    if not (ends and starts):
        return False
    tail = np.arange(padded.shape[1])[None, :] >= lengths[:, None]
    return not np.any(padded[tail])


def _unpadded_lengths(padded: np.ndarray) -> np.ndarray:
    """Each row's length up to its last non-zero byte."""
    nonzero = padded != 0
    last = padded.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
    return np.where(nonzero.any(axis=1), last, 0).astype(np.int64)


def jpeg_frames(padded: np.ndarray, compress_len: np.ndarray | None, where: str) -> list[bytes]:
    """The JPEG bytes of each frame of one camera (``padded``: ``uint8 [N, padded]``), cut
    as the module doc says; ``where`` names the file and the camera."""
    if compress_len is not None:
        table = np.asarray(compress_len)
        if table.ndim != 2 or table.shape[1] != padded.shape[0]:
            raise CorruptData(
                f"{where}: /{LENGTHS} is {list(table.shape)}, expected [cameras, {padded.shape[0]}]"
            )
        if not np.all(np.isfinite(table)) or np.any(table != np.round(table)):
            raise CorruptData(f"{where}: /{LENGTHS} holds lengths that are not whole numbers")
        rows = [r.astype(np.int64) for r in table]
        lengths = next((r for r in rows if _fits(padded, r)), None)
        if lengths is None:
            raise CorruptData(
                f"{where}: no row of /{LENGTHS} cuts this camera's frames into whole JPEGs "
                "(each ending FF D9, zeros after)"
            )
    else:
        lengths = _unpadded_lengths(padded)
        if not _fits(padded, lengths):
            bad = next(
                i
                for i, n in enumerate(lengths)
                if n < 2 or bytes(padded[i, n - 2 : n]) != _EOI  # noqa: E203
            )
            raise CorruptData(
                f"{where}, frame {bad}: not a JPEG ending FF D9 before zero padding (and the "
                f"file has no /{LENGTHS})"
            )
    return [padded[i, : int(n)].tobytes() for i, n in enumerate(lengths)]
