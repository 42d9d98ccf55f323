"""Reading one HDF5 file of robot demonstrations (h5py): robomimic/LIBERO or ALOHA layout.

- **robomimic** (and LIBERO, MimicGen, RoboCasa, Isaac Lab Mimic): ``data/demo_<n>`` groups,
  taken in numeric order (h5py lists them lexically: ``demo_10`` before ``demo_2``). A
  demo's length is ``len(actions)``, or its ``num_samples`` attribute when it has no
  ``actions``. Every dataset under the demo is a column named by its path with ``/`` ->
  ``_``; ``next_obs/*`` only when asked. ``data``'s attributes are the file's metadata,
  ``mask/<key>`` (byte strings of demo names) its filter keys. A demo's ``ep_meta``
  attribute (RoboCasa) becomes a string column; LIBERO's ``problem_info`` JSON attribute
  gives a ``task`` column (its ``language_instruction``).
- **ALOHA**: one file per episode, ``/action`` and ``/observations/{qpos, qvel, effort,
  images/<cam>}``; the episode's length is ``len(action)``; the root's attributes are the
  file's metadata. A file whose root attribute ``compress`` is set holds each camera as
  JPEG frames padded into ``uint8 [N, padded]`` and their lengths in ``/compress_len``
  (:mod:`~treadle.importers.hdf5.aloha_jpeg`).

Every dataset's size is known before it is read: a demo larger than ``max_episode_bytes``
is refused before anything is allocated. A chunked dataset is inflated a whole chunk at a
time, and a chunk may be far larger than the dataset (a 4-row dataset in one 1 GiB chunk of
zeros takes a few kilobytes of file): such a dataset counts as its largest chunk. A dataset
that cannot be read (a corrupt chunk, a filter that is not installed) is
:class:`CorruptData` naming the file, the demo and the dataset. Only the file's own bytes are read: an external
link, a virtual dataset or a dataset stored in external files (which would copy other files
of this machine, any file its user can read, into the table) is :class:`UnsafeInput`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treadle.errors import CorruptData, SchemaMismatch, UnsafeInput
from treadle.importers.episodic import ROW_BYTES
from treadle.importers.hdf5.aloha_jpeg import LENGTHS, is_packed_camera

_DEMO = re.compile(r"demo_(\d+)")
#: the most bytes a dataset read whole besides the columns may take (filter keys, lengths)
SMALL_BYTES = 64 << 20


@dataclass
class Hdf5File:
    """What one file holds: its layout, its episodes (group paths, in order) and metadata."""

    layout: str  # "robomimic" or "aloha"
    demos: list[str]  # group paths: "data/demo_0", ... or "/" for ALOHA
    metadata: dict[str, Any]
    masks: dict[str, list[str]] = field(default_factory=dict)
    compressed: bool = False  # ALOHA's JPEG cameras (:mod:`.aloha_jpeg`)


def open_h5(path: str, where: str) -> Any:
    """``h5py.File(path, "r")``; a file that is not HDF5 is :class:`CorruptData`."""
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise CorruptData(f"{where} is not a readable HDF5 file: {e}") from None


def own(obj: Any, f: Any, where: str, path: str) -> Any:
    """``obj`` (at ``path``, None or an object of ``f``) when its bytes are ``f``'s own;
    else :class:`UnsafeInput`: an external link (or a soft link through one), a virtual
    dataset, or a dataset whose bytes are in external files reads other files of this
    machine."""
    import h5py

    if obj is None:
        return None
    if obj.file != f:
        why = f"a link to {obj.file.filename!r}"
    elif isinstance(obj, h5py.Dataset) and obj.is_virtual:
        why = "a virtual dataset (its bytes are in other files)"
    elif isinstance(obj, h5py.Dataset) and obj.external:
        why = f"stored in external files ({obj.external[0][0]!r}, ...)"
    else:
        return obj
    raise UnsafeInput(
        f"{where}: {path!r} is {why}; only the file's own bytes are imported (an HDF5 file "
        "may not read other files of this machine into a table)"
    )


def read_bytes(ds: Any) -> int:
    """The bytes reading ``ds`` whole holds at once: its values, or one chunk when a chunk is
    larger (a chunk is inflated whole, however few of its values the dataset has)."""
    values = math.prod(ds.shape) * ds.dtype.itemsize
    return max(values, math.prod(ds.chunks) * ds.dtype.itemsize if ds.chunks else 0)


def read_whole(ds: Any, at: str, limit: int | None = None) -> Any:
    """``ds[()]``; one over ``limit`` bytes (:func:`read_bytes`) or that HDF5 cannot read (a
    corrupt chunk, a filter that is not installed) is :class:`CorruptData` naming ``at``."""
    if limit is not None and read_bytes(ds) > limit:
        raise CorruptData(
            f"{at} is {ds.shape} {ds.dtype} in chunks of {ds.chunks}: reading it takes "
            f"{read_bytes(ds):,} bytes, over {limit:,}"
        )
    try:
        return ds[()]
    except OSError as e:
        raise CorruptData(f"{at} cannot be read (corrupt, or a filter missing): {e}") from None


def read_layout(f: Any, where: str) -> Hdf5File:
    """The layout of the open file ``f`` (``where`` names it in errors)."""
    import h5py

    data = own(f.get("data"), f, where, "data")
    if isinstance(data, h5py.Group):
        demos = [k for k in data.keys() if _DEMO.fullmatch(k)]
        if not demos:
            raise CorruptData(f"{where}: group 'data' has no demo_<n> groups")
        demos.sort(key=lambda k: int(k[5:]))
        masks = _masks(f, where, len(demos))
        return Hdf5File("robomimic", [f"data/{k}" for k in demos], attrs(data, where), masks)
    obs = own(f.get("observations"), f, where, "observations")
    action = own(f.get("action"), f, where, "action")
    if isinstance(obs, h5py.Group) and isinstance(action, h5py.Dataset):
        return Hdf5File("aloha", ["/"], attrs(f, where), compressed=bool(f.attrs.get("compress")))
    raise CorruptData(
        f"{where}: no 'data' group of demo_<n> groups (robomimic, LIBERO) and no "
        "'/observations' group with an '/action' dataset (ALOHA)"
    )


def _value(v: Any, where: str) -> Any:
    """An HDF5 attribute as a JSON value (bytes as text, numpy as Python); bytes that are not
    UTF-8 are a :class:`CorruptData` naming ``where`` (decoded with replacement characters,
    ``caf\xe9`` was stored as ``caf\ufffd``: a value h5py does not read)."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptData(f"{where} is not UTF-8 text ({e}): {v[:40]!r}") from None
    if isinstance(v, np.ndarray):
        return [_value(x, where) for x in v.tolist()] if v.dtype.kind in "OSU" else v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def attrs(obj: Any, where: str) -> dict[str, Any]:
    """An HDF5 object's attributes as JSON values (``where`` names the file in errors); one
    JSON cannot hold (an object reference, opaque bytes) is :class:`SchemaMismatch`, never
    its ``repr`` (what ``table.metadata`` got before); an empty one is None."""
    import h5py

    out = {}
    for k in obj.attrs.keys():
        at = f"{where}: attribute {k!r} of {obj.name!r}"
        try:
            raw = obj.attrs[k]
        except (OSError, TypeError, ValueError) as e:
            raise CorruptData(f"{at} cannot be read: {e}") from None
        value = None if isinstance(raw, h5py.Empty) else _value(raw, at)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise SchemaMismatch(
                f"{at} is {type(raw).__name__} {str(raw)[:60]!r}, which table.metadata (JSON) "
                "cannot hold"
            ) from None
        out[str(k)] = value
    return out


def _masks(f: Any, where: str, demos: int) -> dict[str, list[str]]:
    """robomimic's filter keys: ``mask/<key>`` -> demo names (stored as byte strings); a
    key may not list more names than the file has ``demos`` (each is read whole)."""
    import h5py

    mask = own(f.get("mask"), f, where, "mask")
    if not isinstance(mask, h5py.Group):
        return {}
    out = {}
    for key in mask.keys():
        ds = own(mask.get(key), f, where, f"mask/{key}")
        if not isinstance(ds, h5py.Dataset) or ds.dtype.kind not in "SOU" or ds.ndim != 1:
            raise CorruptData(f"{where}: filter key mask/{key} is not a list of demo names")
        if ds.shape[0] > demos:
            raise CorruptData(
                f"{where}: filter key mask/{key} lists {ds.shape[0]} names, the file has "
                f"{demos} demos"
            )
        at = f"{where}: filter key mask/{key}"
        names = read_whole(ds, at, SMALL_BYTES)
        out[key] = [_value(x, at) if isinstance(x, bytes) else str(x) for x in names]
    return out


def datasets(group: Any, next_obs: bool) -> list[tuple[str, Any]]:
    """``(path under group, dataset)`` of every dataset under ``group``, in h5py's order."""
    import h5py

    found: list[tuple[str, Any]] = []

    def visit(path: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and (next_obs or not path.startswith("next_obs/")):
            found.append((path, obj))

    group.visititems(visit)
    return found


def demo_length(group: Any, layout: str, where: str) -> int:
    """A demo's number of moments (see the module doc)."""
    key = "action" if layout == "aloha" else "actions"
    ds = own(group.get(key), group.file, where, key)
    declared = group.attrs.get("num_samples")
    if ds is not None and getattr(ds, "ndim", 0) >= 1:
        n = int(ds.shape[0])
        if declared is not None and int(declared) != n:
            raise CorruptData(f"{where}: attribute num_samples is {int(declared)}, {key} has {n}")
        return n
    if declared is None:
        raise CorruptData(f"{where}: no '{key}' dataset and no num_samples attribute")
    return int(declared)


@dataclass(frozen=True)
class Column:
    """One dataset of a demo, checked: its column name, the dataset and its bytes."""

    path: str
    dataset: Any
    nbytes: int
    camera: bool
    packed: bool = False  # JPEG frames padded into uint8 [N, padded] (:mod:`.aloha_jpeg`)


def demo_columns(
    group: Any, n: int, next_obs: bool, where: str, limit: int, compressed: bool = False
) -> list[Column]:
    """The checked datasets of one demo of ``n`` moments (at most ``limit`` bytes in all);
    ``compressed``: an ALOHA file of JPEG cameras, whose ``compress_len`` is no column."""
    from treadle.importers.cameras import is_camera

    out, total = [], n * ROW_BYTES
    for path, ds in datasets(group, next_obs):
        if compressed and path == LENGTHS:
            continue
        at = f"{where}, dataset {path!r}"
        own(ds, group.file, where, path)
        if ds.dtype.kind not in "biuf":
            raise SchemaMismatch(f"{at}: {ds.dtype} is not numeric (numbers or bools only)")
        if ds.ndim == 0 or ds.shape[0] != n:
            first = "a scalar" if ds.ndim == 0 else f"{ds.shape[0]} rows"
            raise CorruptData(f"{at} has {first}, the demo has {n} moments")
        if 0 in ds.shape[1:]:
            raise SchemaMismatch(f"{at} is {ds.shape}: no values per moment")
        nbytes = math.prod(ds.shape) * ds.dtype.itemsize
        total += read_bytes(ds)
        if total > limit:
            chunks = f" in chunks of {ds.chunks}" if read_bytes(ds) > nbytes else ""
            raise CorruptData(
                f"{where}: its {n} moments and datasets hold over {limit} bytes "
                f"(max_episode_bytes; {ROW_BYTES} a moment besides the data); {path!r} "
                f"alone is {ds.shape} {ds.dtype}{chunks}"
            )
        packed = compressed and is_packed_camera(path, ds.shape, ds.dtype)
        out.append(Column(path, ds, nbytes, packed or is_camera(ds.shape, ds.dtype), packed))
    return out


def task_of(metadata: dict[str, Any]) -> str | None:
    """LIBERO's ``language_instruction`` (in the ``problem_info`` JSON attribute)."""
    info = metadata.get("problem_info")
    if not isinstance(info, str):
        return None
    try:
        task = json.loads(info).get("language_instruction")
    except (ValueError, AttributeError):
        return None
    return task if isinstance(task, str) else None


def control_freq(metadata: dict[str, Any]) -> float | None:
    """robomimic's ``env_args`` JSON ``env_kwargs.control_freq`` (the demos' rate)."""
    try:
        hz = json.loads(metadata["env_args"])["env_kwargs"]["control_freq"]
        return float(hz) if float(hz) > 0 else None
    except (KeyError, ValueError, TypeError):
        return None


def iter_demo_groups(f: Any, info: Hdf5File, where: str) -> Iterator[tuple[str, Any]]:
    """``(demo name, group)`` per episode of the file, in order (``where`` names the file)."""
    for path in info.demos:
        yield (path.rsplit("/", 1)[-1] if path != "/" else ""), own(f[path], f, where, path)
