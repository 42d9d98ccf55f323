"""One RLDS episode (a parsed ``tf.train.Example``) -> the columns of one ``append_episode``.

Each step feature ``steps/<path>`` is a flat list holding every step's values one after the
other; its column is ``<path>`` with ``/`` as ``_`` (``observation/image`` ->
``observation_image``), one entry per step. Values come out as TFDS's own reader returns
them: ints and bools are stored as ``int64`` and cast back to the declared dtype (a bool is
any non-zero value), floats are stored as ``float32`` (a ``float64`` feature is
``float32``-exact, as in TFDS), ``Text`` is UTF-8 (checked), a ``string`` tensor stays
bytes. Each episode-level feature ``episode_metadata/<k>`` becomes a column
``episode_metadata_<k>`` holding the episode's one value on each of its steps.

Images (``Image`` features, one encoded image per step), by ``images=``: ``"encoded"``
keeps the bytes as they are; ``"decoded"`` stores the pixels (``uint8 [H, W, 3]``): Pillow's
decode, or with ``pixels="tfds"`` TFDS's own (:mod:`~treadle.importers.rlds.tf_pixels`);
``"video"`` encodes the decoded frames of an 8-bit colour camera to one H.264 stream
(:mod:`treadle.importers.camera_video`), while other images (16-bit or 1-channel depth)
are kept encoded and the report says why.

Checks, each a named error (the shard, record and episode): a feature the record has that
``features.json`` does not declare, one it lacks, a list of the wrong value type, and step
lists of different lengths, an image of another size than the one declared (from its header,
before it is decoded). Episode-level values, copied onto every step, may make at most
``max_record_bytes`` in all (a few KiB of them on a million one-byte steps made gigabytes).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from treadle.errors import CorruptData, SchemaMismatch, UnsafeInput, UnsupportedFormat
from treadle.importers.arrow import check_rename, column_name
from treadle.importers.camera_video import encode_camera
from treadle.importers.images import decode_image
from treadle.importers.rlds.tf_pixels import decode_like_tfds
from treadle.importers.rlds.tfds_folder import Leaf, RldsFolder
from treadle.importers.rlds.tfrecord import MAX_RECORD_BYTES
from treadle.video.image_decode import image_header

_KIND_OF = {"text": "bytes", "bytes": "bytes", "image": "bytes"}
_KEEP_ENCODED = "not 8-bit colour (H, W, 3): kept as encoded images"


def _list_kind(leaf: Leaf) -> str:
    if leaf.kind in _KIND_OF or leaf.encoding in ("bytes", "zlib"):
        return "bytes"
    return "float" if leaf.dtype.startswith(("float", "bfloat")) else "int64"


@dataclass(frozen=True)
class Camera:
    """What one image step feature becomes: its column, and whether it goes to video."""

    column: str
    video: bool


class StepsMapping:
    """How the features of one RLDS folder map to columns (built once per import)."""

    def __init__(
        self,
        folder: RldsFolder,
        images: str,
        rename: dict[str, str] | None,
        pixels: str = "pillow",
        max_repeat_bytes: int = MAX_RECORD_BYTES,
    ):
        self.folder, self.images, self.pixels = folder, images, pixels
        self.max_repeat_bytes = max_repeat_bytes
        where = f"RLDS dataset {folder.name!r}"
        rename = {k.replace("/", "_"): v for k, v in (rename or {}).items()}
        keys = [f"steps/{leaf.path}" for leaf in folder.steps] + [
            leaf.path for leaf in folder.episode
        ]
        defaults = [leaf.path.replace("/", "_") for leaf in folder.steps + folder.episode]
        check_rename(rename, defaults, where)
        self.leaf = dict(zip(keys, folder.steps + folder.episode))
        self.column: dict[str, str] = {}
        seen: dict[str, str] = {}
        for key, default in zip(keys, defaults):
            col = column_name(default, where, rename)
            if col in seen:
                raise SchemaMismatch(
                    f"{where}: features {seen[col]!r} and {key!r} would both be stored as "
                    f"column {col!r}; rename one (rename={{{default!r}: ...}})"
                )
            seen[col], self.column[key] = key, col
        self.cameras = {
            key: Camera(self.column[key], images == "video" and _is_colour(leaf))
            for key, leaf in self.leaf.items()
            if leaf.kind == "image" and key.startswith("steps/")
        }
        for key, leaf in self.leaf.items():
            if leaf.kind == "image" and key not in self.cameras:
                raise UnsupportedFormat(f"{where}: image feature {key!r} outside 'steps'")
            if key in self.cameras and images == "decoded" and leaf.dtype != "uint8":
                raise UnsupportedFormat(
                    f"{where}: image feature {key!r} is {leaf.dtype}; images='decoded' stores "
                    "8-bit pixels only: use images='encoded' to keep its bytes exact"
                )

    def why_kept(self, key: str) -> str:
        """Why an image feature is not stored as video (empty when it is)."""
        if self.images != "video" or self.cameras[key].video:
            return ""
        return _KEEP_ENCODED

    def episode(
        self, example: dict[str, tuple[str, Any]], where: str, fps: float | None
    ) -> tuple[dict[str, Any], dict[str, tuple[int, Any, Any]], int]:
        """``(columns, {camera key: (source bytes, stream or None, per-frame PSNR)}, steps)``;
        nothing is decoded for an episode with no steps."""
        undeclared = sorted(set(example) - set(self.leaf))
        if undeclared:
            raise SchemaMismatch(
                f"{where}: the record has feature {undeclared[0]!r}, which features.json "
                "does not declare"
            )
        lacking = sorted(set(self.leaf) - set(example))
        if lacking:
            raise CorruptData(f"{where}: the record lacks feature {lacking[0]!r}")
        steps = self._num_steps(example, where)
        cols: dict[str, Any] = {}
        if steps == 0:
            return cols, {}, 0
        cams: dict[str, tuple[int, Any, Any]] = {}
        repeated = 0
        for key, leaf in self.leaf.items():
            kind, values = example[key]
            if kind not in (_list_kind(leaf), "empty"):
                raise CorruptData(f"{where}: feature {key!r} holds {kind} values, not {leaf.kind}")
            at = f"{where}, feature {key!r}"
            if key in self.cameras:
                cols[self.column[key]], cams[key] = self._camera(key, leaf, values, fps, at)
            elif key.startswith("steps/"):
                cols[self.column[key]] = _values(leaf, values, steps, at)
            else:
                one = _values(leaf, values, 1, at)
                repeated += _nbytes(one) * steps
                if repeated > self.max_repeat_bytes:
                    raise UnsafeInput(
                        f"{at}: {_nbytes(one):,} bytes, on each of the episode's {steps:,} "
                        f"steps, make its episode-level values over {self.max_repeat_bytes:,} "
                        "bytes (max_record_bytes)"
                    )
                cols[self.column[key]] = _repeat(one, steps)
        return cols, cams, steps

    def _num_steps(self, example: dict[str, tuple[str, Any]], where: str) -> int:
        counts = {}
        for key, leaf in self.leaf.items():
            if key.startswith("steps/"):
                n = len(example[key][1])
                size = 1 if leaf.encoding in ("bytes", "zlib") else leaf.size  # one per step
                if n % size:
                    raise CorruptData(
                        f"{where}: feature {key!r} has {n} values, not a whole number of "
                        f"steps of shape {list(leaf.shape)}"
                    )
                counts[key] = n // size
        if len(set(counts.values())) > 1:
            lo, hi = min(counts, key=counts.get), max(counts, key=counts.get)
            raise CorruptData(
                f"{where}: step lists differ in length: {lo!r} has {counts[lo]} steps, "
                f"{hi!r} has {counts[hi]}"
            )
        return next(iter(counts.values()))

    def _camera(self, key: str, leaf: Leaf, values: list[bytes], fps: float | None, at: str):
        nbytes = sum(len(b) for b in values)
        if self.images == "encoded" or not self.cameras[key].video and self.images == "video":
            return pa.array(values, pa.large_binary()), (nbytes, None, None)
        pixels = _stack(
            [self._decode(leaf, b, f"{at}, step {j}") for j, b in enumerate(values)], at
        )
        if self.images == "decoded":
            return pixels, (nbytes, None, None)
        assert fps is not None  # checked before the import starts
        stream, frame_psnr = encode_camera(pixels, fps, at)
        return stream, (nbytes, stream, frame_psnr)

    def _decode(self, leaf: Leaf, data: bytes, where: str) -> np.ndarray:
        """One image's pixels, ``[H, W, C]`` as TFDS gives them (grey keeps its ``1``)."""
        channels = leaf.image_shape[-1] if len(leaf.image_shape) == 3 else 3
        _check_size(leaf, data, where)
        if self.pixels == "tfds":
            return decode_like_tfds(data, channels, where)
        pixels = decode_image(data, leaf.encoding or "", where)
        return pixels[..., None] if pixels.ndim == 2 else pixels


def _check_size(leaf: Leaf, data: bytes, where: str) -> None:
    """An image of a size ``features.json`` fixes has that size, read from its header before
    anything is decoded (a small PNG of zeros may decode to gigabytes on every step)."""
    if len(leaf.image_shape) < 2 or min(leaf.image_shape[:2]) < 1:
        return
    head = image_header(data, where)
    if head.size != tuple(leaf.image_shape[:2]):
        h, w = leaf.image_shape[:2]
        raise CorruptData(
            f"{where}: a {head.width}x{head.height} image, features.json declares {w}x{h} "
            f"(shape {list(leaf.image_shape)})"
        )


def _is_colour(leaf: Leaf) -> bool:
    shape = leaf.image_shape
    return leaf.dtype == "uint8" and (len(shape) != 3 or shape[2] == 3)


def _stack(frames: list[np.ndarray], where: str) -> np.ndarray:
    shapes = sorted({f.shape for f in frames})
    if len(shapes) > 1:
        raise SchemaMismatch(f"{where}: images of different sizes in one episode: {shapes[:2]}")
    return np.stack(frames)


def _values(leaf: Leaf, values: Any, steps: int, where: str) -> Any:
    """One feature's flat list as ``steps`` entries, typed as TFDS returns them."""
    if leaf.encoding in ("bytes", "zlib"):
        return unpack_tensors(leaf, values, steps, where)
    if len(values) != steps * leaf.size:
        raise CorruptData(f"{where}: {len(values)} values, expected {steps * leaf.size}")
    if leaf.kind == "text":
        try:
            return [b.decode("utf-8") for b in values]
        except UnicodeDecodeError as e:
            raise CorruptData(f"{where}: Text is not UTF-8 ({e})") from None
    if leaf.kind in ("bytes", "image"):
        if leaf.shape and leaf.size != 1:
            raise SchemaMismatch(
                f"{where}: string tensors of shape {list(leaf.shape)} are not read"
            )
        return pa.array(values, pa.large_binary())
    arr = np.asarray(values)
    if leaf.dtype == "bool":
        arr = arr != 0
    elif leaf.dtype == "uint64":
        arr = arr.view(np.uint64)
    elif leaf.dtype == "bfloat16":
        raise SchemaMismatch(f"{where}: bfloat16 features are not read")
    else:
        arr = arr.astype(np.dtype(leaf.dtype), copy=False)
    return arr.reshape((steps, *leaf.shape))


def _nbytes(one: Any) -> int:
    """The bytes of one episode-level value (an entry of :func:`_values`)."""
    if isinstance(one, list):
        return sum(len(v) for v in one)
    return int(one.nbytes)


def _repeat(one: Any, steps: int) -> Any:
    """An episode-level value (one entry) on each of ``steps`` steps."""
    if isinstance(one, list):
        return one * steps
    if isinstance(one, pa.Array):
        return pa.array(one.to_pylist() * steps, one.type)
    return np.ascontiguousarray(np.broadcast_to(one[0], (steps, *one.shape[1:])))


def unpack_tensors(leaf: Leaf, values: list[bytes], steps: int, where: str) -> np.ndarray:
    """A ``bytes``/``zlib``-encoded tensor feature: one entry's raw array bytes per step
    (compressed with zlib), each inflated no further than the bytes its shape needs."""
    if len(values) != steps:
        raise CorruptData(f"{where}: {len(values)} entries, expected {steps}")
    dtype = np.dtype(leaf.dtype)
    want = leaf.size * dtype.itemsize
    raw = []
    for j, data in enumerate(values):
        if leaf.encoding == "zlib":
            inflate = zlib.decompressobj()
            try:
                data = inflate.decompress(data, want + 1)
            except zlib.error as e:
                raise CorruptData(f"{where}, entry {j}: not zlib data ({e})") from None
        if len(data) != want:
            raise CorruptData(
                f"{where}, entry {j}: {len(data)} bytes, {want} expected for "
                f"{dtype} {list(leaf.shape)}"
            )
        raw.append(data)
    return np.frombuffer(b"".join(raw), dtype).reshape((steps, *leaf.shape))
