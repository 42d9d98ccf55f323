"""ROS messages -> column values: which types are read, and how (the table in docs/api.md).

A topic maps to one column, or a few for ``JointState``. :func:`converter` picks, from the
topic's message type (and an optional field path), a :class:`Converter`: ``value(msg)``
gives one moment's values ``{suffix: value}`` (``""`` is the column itself), ``kind`` says
what they are (``"float"`` may be interpolated; ``"camera"``, ``"image"`` (already encoded
bytes), ``"depth"``, ``"int"``, ``"bool"``, ``"str"`` and ``"quat"`` may not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from treadle.errors import CorruptData, SchemaMismatch

_GEOMETRY = {
    "geometry_msgs/msg/Pose": ("pose", "quat"),
    "geometry_msgs/msg/PoseStamped": ("pose", "quat"),
    "geometry_msgs/msg/Twist": ("twist", "float"),
    "geometry_msgs/msg/TwistStamped": ("twist", "float"),
    "geometry_msgs/msg/Wrench": ("wrench", "float"),
    "geometry_msgs/msg/WrenchStamped": ("wrench", "float"),
}
_STD_NUMBERS = {
    **{f"std_msgs/msg/Float{b}": "float" for b in (32, 64)},
    **{f"std_msgs/msg/{s}Int{b}": "int" for s in ("", "U") for b in (8, 16, 32, 64)},
    "std_msgs/msg/Bool": "bool",
    "std_msgs/msg/String": "str",
}
#: Image encodings read: name -> (dtype, channels, kind)
_ENCODINGS = {
    "rgb8": (np.uint8, 3, "camera"),
    "bgr8": (np.uint8, 3, "camera"),
    "mono8": (np.uint8, 1, "camera"),
    "16UC1": (np.uint16, 1, "depth"),
    "mono16": (np.uint16, 1, "depth"),
    "32FC1": (np.float32, 1, "depth"),
}


@dataclass(frozen=True)
class Converter:
    """How one topic's messages become values (see the module doc)."""

    kind: str
    value: Callable[[Any], dict[str, Any]]
    joints: list[str] | None = None


def _xyz(v: Any) -> list[float]:
    return [float(v.x), float(v.y), float(v.z)]


def _geometry(msg: Any, field: str) -> np.ndarray:
    inner = getattr(msg, field, msg)
    if field == "pose":
        o = inner.orientation
        return np.asarray([*_xyz(inner.position), o.x, o.y, o.z, o.w], np.float64)
    a, b = ("linear", "angular") if field == "twist" else ("force", "torque")
    return np.asarray([*_xyz(getattr(inner, a)), *_xyz(getattr(inner, b))], np.float64)


def image_pixels(msg: Any, where: str) -> tuple[np.ndarray, str]:
    """A ``sensor_msgs/Image`` as ``[H, W, C]`` pixels (RGB for colour) and its kind."""
    kind, enc = image_kind(msg, where), str(msg.encoding)
    dtype, channels, _ = _ENCODINGS[enc]
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    row = w * channels * np.dtype(dtype).itemsize
    data = np.asarray(msg.data, np.uint8)
    if step < row or data.size != step * h:
        raise CorruptData(f"{where}: Image of {h}x{w} {enc} has {data.size} bytes, step {step}")
    rows = data.reshape(h, step)[:, :row]
    order = ">" if msg.is_bigendian else "<"
    # no copy of native-order pixels: the value is a view of the message's bytes
    pixels = np.ascontiguousarray(rows).view(np.dtype(dtype).newbyteorder(order))
    pixels = pixels.astype(dtype, copy=False)
    pixels = pixels.reshape(h, w, channels)
    if enc == "bgr8":
        pixels = pixels[..., ::-1]
    if enc == "mono8":
        pixels = np.repeat(pixels, 3, axis=2)  # a grey camera as RGB, exactly
    return np.ascontiguousarray(pixels), kind


def image_kind(msg: Any, where: str) -> str:
    """The kind (``camera``, ``depth``) of a ``sensor_msgs/Image`` by its encoding, nothing
    converted (a topic's first message says it; its pixels may never be used)."""
    enc = str(msg.encoding)
    if enc not in _ENCODINGS:
        raise SchemaMismatch(
            f"{where}: Image encoding {enc!r} is not read (rgb8, bgr8, mono8, 16UC1, mono16, 32FC1)"
        )
    return _ENCODINGS[enc][2]


def _compressed_format(msg: Any, where: str) -> None:
    """A ``CompressedImage`` of a format that is read, else a named error."""
    fmt = str(msg.format).lower()
    if "compresseddepth" in fmt:
        raise SchemaMismatch(
            f"{where}: CompressedImage format {msg.format!r} (compressedDepth) is not read: "
            "record depth as sensor_msgs/Image 16UC1 or 32FC1"
        )
    if "jpeg" not in fmt and "jpg" not in fmt and "png" not in fmt:
        raise SchemaMismatch(f"{where}: CompressedImage format {msg.format!r} is not jpeg or png")


def _compressed(msg: Any, where: str) -> bytes:
    _compressed_format(msg, where)
    return np.asarray(msg.data, np.uint8).tobytes()


def _unique_joints(names: list[str], where: str) -> list[str]:
    """``names``, or a named error for a joint named twice (whose value would be which?)."""
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise CorruptData(f"{where}: JointState names joint {twice!r} twice (joints {names})")
    return names


def _joint_value(msg: Any, names: list[str], where: str) -> dict[str, Any]:
    got = [str(n) for n in msg.name]
    if got != names:
        at = {n: i for i, n in enumerate(_unique_joints(got, where))}
        missing = [n for n in names if n not in at]
        if missing:
            raise CorruptData(f"{where}: JointState has no joint {missing[0]!r} (joints {names})")
        pos = [at[n] for n in names]
    else:
        pos = list(range(len(names)))
    out = {}
    for part in ("position", "velocity", "effort"):
        arr = np.asarray(getattr(msg, part), np.float64)
        if arr.size == 0:
            continue
        if arr.size != len(got):
            raise CorruptData(
                f"{where}: JointState {part} has {arr.size} values for {len(got)} joints"
            )
        out[f"_{part}"] = arr[pos]
    return out


def _field(msg: Any, path: str, msgtype: str, where: str) -> Any:
    value = msg
    for part in path.split("."):
        if not hasattr(value, part):
            raise SchemaMismatch(f"{where}: {msgtype} has no field {path!r} (no {part!r})")
        value = getattr(value, part)
    return value


def _plain(value: Any, where: str, field: str = "data") -> tuple[Any, str]:
    """Field ``field``'s value: a number, bool, string, numeric array, or a Vector3 /
    Quaternion."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value), "bool"
    if isinstance(value, (int, np.integer)):
        return int(value), "int"
    if isinstance(value, (float, np.floating)):
        return float(value), "float"
    if isinstance(value, str):
        return value, "str"
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        # a copy: rosbags' arrays are views of the whole message, which a view would keep
        return value.copy(), "float" if value.dtype.kind == "f" else "int"
    if all(hasattr(value, a) for a in "xyz"):
        quat = hasattr(value, "w")
        vals = [value.x, value.y, value.z, *([value.w] if quat else [])]
        return np.asarray(vals, np.float64), "quat" if quat else "float"
    raise SchemaMismatch(
        f"{where}: field {field!r} has type {type(value).__name__}, which is not read (a "
        "field must be a number, bool, string, numeric array, or x/y/z(/w) vector)"
    )


def converter(
    msgtype: str, field: str | None, first: Any, where: str, joints: list[str] | None = None
) -> Converter:
    """The :class:`Converter` of a topic of ``msgtype`` (``first`` is its first message;
    ``joints``: the JointState order of every bag, else the first message's)."""
    if field:
        kind = _plain(_field(first, field, msgtype, where), where, field)[1]
        return Converter(
            kind, lambda m: {"": _plain(_field(m, field, msgtype, where), where, field)[0]}
        )
    if msgtype == "sensor_msgs/msg/JointState":
        names = list(joints) if joints is not None else [str(n) for n in first.name]
        _unique_joints(names, where)
        return Converter("float", lambda m: _joint_value(m, names, where), names)
    if msgtype == "sensor_msgs/msg/Image":
        kind = image_kind(first, where)
        return Converter(kind, lambda m: {"": image_pixels(m, where)[0]})
    if msgtype == "sensor_msgs/msg/CompressedImage":
        _compressed_format(first, where)
        return Converter("image", lambda m: {"": _compressed(m, where)})
    if msgtype in _GEOMETRY:
        part, kind = _GEOMETRY[msgtype]
        return Converter(kind, lambda m: {"": _geometry(m, part)})
    if msgtype in _STD_NUMBERS:
        kind = _STD_NUMBERS[msgtype]
        return Converter(kind, lambda m: {"": _plain(m.data, where)[0]})
    raise SchemaMismatch(
        f"{where}: message type {msgtype} is not read; name a field of it "
        "('/topic:field.path=column') or pick another topic"
    )


def header_stamp(msg: Any) -> int | None:
    """``header.stamp`` in ns, or None for a message without a header."""
    header = getattr(msg, "header", None)
    stamp = getattr(header, "stamp", None)
    if stamp is None:
        return None
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)
