"""``tf.train.Example`` without TensorFlow: the message defined at run time, parsed by protobuf.

The schema is TensorFlow's ``example.proto`` / ``feature.proto`` (package ``tensorflow``,
proto3), built here as a ``FileDescriptorProto`` and turned into message classes by
Google's ``protobuf`` runtime (the ``treadle[rlds]`` extra; its C ``upb`` backend parses).
Nothing is generated or copied from TensorFlow: the six messages are small and stable
(``BytesList``, ``FloatList``, ``Int64List``, ``Feature`` with its ``oneof kind``,
``Features`` with its ``map<string, Feature>``, ``Example``).

:func:`parse_example` returns ``{name: (kind, values)}`` with ``kind`` one of ``"bytes"``
(a list of ``bytes``), ``"float"`` (``float32`` array) or ``"int64"`` (``int64`` array).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from treadle.errors import CorruptData, MissingDependency, UnsafeInput
from treadle.importers.rlds.tfrecord import RLDS_INSTALL

_LIST_FIELD = {"bytes": 12, "float": 2, "int64": 3}  # FieldDescriptorProto.Type numbers
_REPEATED, _OPTIONAL, _MESSAGE, _STRING = 3, 1, 11, 9


def _protobuf() -> tuple[Any, Any, Any]:
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError as e:
        raise MissingDependency(
            f"reading RLDS (tf.train.Example) needs the 'protobuf' package, which is not "
            f"installed ({e}); install it with: {RLDS_INSTALL}"
        ) from None
    return descriptor_pb2, descriptor_pool, message_factory


@functools.cache
def example_class() -> Any:
    """The ``tensorflow.Example`` message class (built once, in a private descriptor pool)."""
    descriptor_pb2, descriptor_pool, message_factory = _protobuf()
    fd = descriptor_pb2.FileDescriptorProto(
        name="treadle_tf_example.proto", package="tensorflow", syntax="proto3"
    )
    for kind, ftype in _LIST_FIELD.items():
        m = fd.message_type.add(name=f"{kind.capitalize()}List")
        f = m.field.add(name="value", number=1, type=ftype, label=_REPEATED)
        if kind != "bytes":
            f.options.packed = True
    feature = fd.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, kind in enumerate(("bytes", "float", "int64"), start=1):
        feature.field.add(
            name=f"{kind}_list",
            number=number,
            type=_MESSAGE,
            label=_OPTIONAL,
            type_name=f".tensorflow.{kind.capitalize()}List",
            oneof_index=0,
        )
    features = fd.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_STRING, label=_OPTIONAL)
    entry.field.add(
        name="value", number=2, type=_MESSAGE, label=_OPTIONAL, type_name=".tensorflow.Feature"
    )
    features.field.add(
        name="feature",
        number=1,
        type=_MESSAGE,
        label=_REPEATED,
        type_name=".tensorflow.Features.FeatureEntry",
    )
    example = fd.message_type.add(name="Example")
    example.field.add(
        name="features", number=1, type=_MESSAGE, label=_OPTIONAL, type_name=".tensorflow.Features"
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


#: the most ``bytes_list`` entries one record may hold: protobuf keeps ~32 bytes per entry
#: and Python ~40 more, from 2 bytes on the wire (an empty string), so entries, not the
#: record's size, bound the memory a parse takes (an RLDS episode holds one per step and
#: camera: thousands)
MAX_BYTES_ENTRIES = 4_000_000


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("a varint runs past its message")
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return value, i


def _delimited(buf: memoryview, field: int) -> list[memoryview]:
    """The payloads of the length-delimited ``field`` of one message (wire format)."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            i = _varint(buf, i)[1]
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        elif wire == 2:
            n, i = _varint(buf, i)
            if key >> 3 == field:
                out.append(buf[i : i + n])
            i += n
        else:
            raise ValueError(f"wire type {wire}")
        if i > len(buf):
            raise ValueError("a field runs past its message")
    return out


def count_bytes_entries(data: bytes, where: str, limit: int | None = None) -> int:
    """The ``bytes_list`` entries of a serialized ``Example``, counted on the wire before
    protobuf parses it; over ``limit`` (:data:`MAX_BYTES_ENTRIES`) is :class:`UnsafeInput`
    naming ``where``."""
    limit = MAX_BYTES_ENTRIES if limit is None else limit
    total = 0
    try:
        for features in _delimited(memoryview(data), 1):
            for entry in _delimited(features, 1):
                for feature in _delimited(entry, 2):
                    for blist in _delimited(feature, 1):
                        total += len(_delimited(blist, 1))
                        if total > limit:
                            raise UnsafeInput(
                                f"{where}: over {limit:,} bytes_list entries in one record "
                                "(each costs ~70 bytes of memory to parse; a record built to "
                                "exhaust memory)"
                            )
    except UnsafeInput:
        raise
    except ValueError as e:
        raise CorruptData(f"{where}: not a tf.train.Example ({e})") from None
    return total


def parse_example(data: bytes, where: str) -> dict[str, tuple[str, Any]]:
    """One serialized ``tf.train.Example`` -> ``{feature name: (kind, values)}``.

    A record that is not a valid ``Example`` is :class:`CorruptData` naming ``where``; one
    of over :data:`MAX_BYTES_ENTRIES` strings is :class:`UnsafeInput`, before parsing.
    """
    count_bytes_entries(data, where)
    msg = example_class()()
    try:
        msg.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError (its module path varies by backend)
        raise CorruptData(f"{where}: not a tf.train.Example ({type(e).__name__}: {e})") from None
    out: dict[str, tuple[str, Any]] = {}
    for name, feature in msg.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            out[name] = ("bytes", list(feature.bytes_list.value))
        elif kind == "float_list":
            out[name] = ("float", np.asarray(feature.float_list.value, dtype=np.float32))
        elif kind == "int64_list":
            out[name] = ("int64", np.asarray(feature.int64_list.value, dtype=np.int64))
        else:  # a feature with no list: TF reads it as empty
            out[name] = ("empty", [])
    return out
