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

from treadle.errors import CorruptData, MissingDependency
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


def parse_example(data: bytes, where: str) -> dict[str, tuple[str, Any]]:
    """One serialized ``tf.train.Example`` -> ``{feature name: (kind, values)}``.

    A record that is not a valid ``Example`` is :class:`CorruptData` naming ``where``.
    """
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
