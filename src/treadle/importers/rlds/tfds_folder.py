"""A TFDS dataset version folder: its split's shards (``dataset_info.json``) and features
(``features.json``), read without TensorFlow.

``dataset_info.json`` names the dataset, the file format (only ``tfrecord`` is read) and,
per split, its shard file template and ``shardLengths`` (episodes per shard): so episode
``i`` is numbered over the shards in file order without reading them, and each shard's
record count is checked against it when read.

``features.json`` is TFDS's ``FeaturesDict`` as JSON. RLDS's top level holds ``steps``
(a ``Dataset``: each feature a list with one entry per step) and episode-level features
(``episode_metadata``). The leaves read: ``Tensor`` and ``Scalar`` (any numeric or bool
dtype, fixed shape; ``encoding`` ``none``, or ``bytes``/``zlib``: each entry's raw array
bytes, compressed for ``zlib``), ``Text``, ``ClassLabel`` (an ``int64``), and ``Image``
(encoded bytes, one per step). Anything else (``Video``, ``Audio``, nested sequences,
dynamic shapes) is
:class:`~treadle.errors.UnsupportedFormat` naming the feature.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from treadle.errors import CorruptData, NotFound, UnsupportedFormat
from treadle.importers.sources import Source, parse_manifest

DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_DTYPES = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "string",
}  # fmt: skip
_TEMPLATE_KEY = re.compile(r"\{([A-Z_]+)\}")
#: the most values one entry of a tensor feature may hold (each takes a byte or more of a
#: record, and a record of 4 GiB is past any real episode)
MAX_VALUES = 1 << 32


@dataclass(frozen=True)
class Leaf:
    """One feature: its path under ``steps/`` (or from the top), what it is, dtype, shape.

    ``kind``: ``"tensor"`` (numbers or bool), ``"bytes"`` (a ``string`` tensor), ``"text"``,
    ``"image"``. ``encoding`` is an image's (``"jpeg"``, ``"png"``), a tensor's stored as
    raw bytes per entry (``"bytes"``, ``"zlib"``: compressed), or None, and
    ``image_shape`` its ``(H, W, C)`` as declared (-1 where it varies).
    """

    path: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    encoding: str | None = None
    image_shape: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        """Values per entry (1 for a scalar)."""
        return math.prod(self.shape)  # exact: numpy's int64 product wraps to 0 or a few


@dataclass(frozen=True)
class Shard:
    """One TFRecord file of the split: its name under the folder, its episode count and the
    number of its first episode."""

    name: str
    episodes: int
    first: int


@dataclass(frozen=True)
class RldsFolder:
    """What a TFDS version folder says about one split."""

    name: str
    split: str
    shards: list[Shard]
    steps: list[Leaf]
    episode: list[Leaf]

    @property
    def num_episodes(self) -> int:
        return sum(s.episodes for s in self.shards)


def read_folder(source: Source, split: str) -> RldsFolder:
    """Read ``dataset_info.json`` and ``features.json`` for ``split`` (see module docstring)."""
    missing = [f for f in ("dataset_info.json", "features.json") if not source.exists(f)]
    if missing:
        raise UnsupportedFormat(
            f"{source.root} is not a TFDS dataset version folder (no {' or '.join(missing)}); "
            "give the folder that holds them, e.g. gs://.../bridge/1.0.0"
        )
    info = _json(source, "dataset_info.json")
    features = _json(source, "features.json")
    where = source.describe("dataset_info.json")
    name, shards = parse_manifest(lambda: _shards(info, split, where), where, "dataset_info.json")
    fwhere = source.describe("features.json")
    steps, episode = parse_manifest(lambda: _features(features, fwhere), fwhere, "features.json")
    return RldsFolder(name, split, shards, steps, episode)


def _json(source: Source, rel: str) -> Any:
    try:
        return json.loads(source.read(rel))
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptData(f"{source.describe(rel)} is not JSON: {e}") from None


def _shards(info: dict[str, Any], split: str, where: str) -> tuple[str, list[Shard]]:
    name = str(info["name"])
    fmt = info.get("fileFormat", "tfrecord")
    if fmt != "tfrecord":
        raise UnsupportedFormat(f"{where}: file format {fmt!r}; only 'tfrecord' is read")
    splits = {s["name"]: s for s in info.get("splits", [])}
    if split not in splits:
        raise NotFound(f"{where}: no split {split!r}; the splits are {sorted(splits)}")
    spec = splits[split]
    if "shardLengths" not in spec:
        raise UnsupportedFormat(f"{where}: split {split!r} has no shardLengths (TFDS < 4.0?)")
    lengths = [int(n) for n in spec["shardLengths"]]
    if any(n < 0 for n in lengths):
        raise CorruptData(f"{where}: split {split!r} has a negative shard length")
    template = spec.get("filepathTemplate") or DEFAULT_TEMPLATE
    shards, first = [], 0
    for i, n in enumerate(lengths):
        shards.append(Shard(_shard_name(template, name, split, fmt, i, len(lengths)), n, first))
        first += n
    return name, shards


def _shard_name(template: str, name: str, split: str, fmt: str, i: int, n: int) -> str:
    values = {
        "DATASET": name,
        "SPLIT": split,
        "FILEFORMAT": fmt,
        "SHARD_INDEX": f"{i:05d}",
        "NUM_SHARDS": f"{n:05d}",
        "SHARD_X_OF_Y": f"{i:05d}-of-{n:05d}",
    }

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise UnsupportedFormat(f"shard file template {template!r}: unknown {m.group(0)}")
        return values[m.group(1)]

    return _TEMPLATE_KEY.sub(sub, template)


def _features(doc: dict[str, Any], where: str) -> tuple[list[Leaf], list[Leaf]]:
    top = doc["featuresDict"]["features"]
    steps: list[Leaf] = []
    episode: list[Leaf] = []
    for key, node in top.items():
        if key == "steps":
            if "sequence" not in node:
                raise UnsupportedFormat(f"{where}: 'steps' is not a Dataset of steps")
            steps = _leaves(node["sequence"]["feature"], "", where)
        else:
            episode += _leaves(node, f"{key}/", where)
    if not steps:
        raise UnsupportedFormat(f"{where}: no 'steps' features: not an RLDS dataset")
    return steps, episode


def _leaves(node: dict[str, Any], prefix: str, where: str) -> list[Leaf]:
    """The leaves under one feature node, depth first, in the order features.json lists them."""
    path = prefix.rstrip("/")
    if "featuresDict" in node:
        out: list[Leaf] = []
        for k, child in node["featuresDict"]["features"].items():
            out += _leaves(child, f"{prefix}{k}/", where)
        return out
    if "tensor" in node:
        t = node["tensor"]
        dtype, encoding = str(t["dtype"]), str(t.get("encoding", "none"))
        packed = encoding in ("bytes", "zlib")
        if (
            encoding not in ("none", "bytes", "zlib")
            or dtype not in _DTYPES
            or (packed and dtype in ("string", "bfloat16"))
        ):
            raise UnsupportedFormat(
                f"{where}: feature {path!r} is a {dtype} tensor with encoding {encoding!r}; "
                "numeric, bool and string tensors are read (encoding 'none'; numbers and "
                "bool also 'bytes' or 'zlib')"
            )
        shape = _shape(t.get("shape", {}), path, where)
        kind = "bytes" if dtype == "string" else "tensor"
        return [Leaf(path, kind, dtype, shape, encoding if packed else None)]
    if "text" in node:
        return [Leaf(path, "text", "string", ())]
    if "classLabel" in node:
        return [Leaf(path, "tensor", "int64", ())]
    if "image" in node:
        img = node["image"]
        enc = str(img.get("encodingFormat") or "png")
        dims = tuple(int(d) for d in img.get("shape", {}).get("dimensions", []))
        return [Leaf(path, "image", str(img.get("dtype", "uint8")), (), enc, dims)]
    kind = node.get("pythonClassName", "?").rsplit(".", 1)[-1]
    raise UnsupportedFormat(f"{where}: feature {path!r} is a TFDS {kind}, which is not read")


def _shape(shape: dict[str, Any], path: str, where: str) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape.get("dimensions", []))
    if any(d < 0 for d in dims):
        raise UnsupportedFormat(f"{where}: feature {path!r} has a dynamic shape {list(dims)}")
    if 0 in dims:
        raise UnsupportedFormat(f"{where}: feature {path!r} has shape {list(dims)}: no values")
    if math.prod(dims) > MAX_VALUES:
        raise UnsupportedFormat(
            f"{where}: feature {path!r} has shape {list(dims)}: {math.prod(dims):,} values an "
            f"entry, more than any record holds (at most {MAX_VALUES:,})"
        )
    return dims
