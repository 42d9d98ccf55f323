"""``td.info()``: the versions treadle runs with and whether each fast path is on.

Every fast path falls back to a slower, equally exact path when one of its run-time checks
fails (:mod:`treadle.fastpaths`). :func:`info` probes each on this machine — a tiny H.264
stream decoded and converted, a tiny local table read — and adds what went off in this
process so far; ``treadle info`` prints it.
"""

from __future__ import annotations

import platform
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treadle import fastpaths

__all__ = ["FastPath", "Info", "info"]

_PACKAGES = ("treadle", "torch", "pylance", "av", "obstore", "pyarrow", "numpy", "pillow",
             "triton")  # fmt: skip


@dataclass(frozen=True)
class FastPath:
    """One fast path: ``on``, or off with ``reason``; ``instead``: what runs when it is off."""

    name: str
    on: bool
    reason: str | None
    instead: str


@dataclass(frozen=True)
class Info:
    """What :func:`info` found: package ``versions`` and each of :data:`fastpaths.PATHS`."""

    versions: dict[str, str]
    paths: dict[str, FastPath] = field(default_factory=dict)
    object_cache: dict[str, Any] = field(default_factory=dict)
    """Where the local object cache of object-store reads lives: ``directory``,
    ``max_bytes``, ``used_bytes`` (:mod:`treadle.storage.filecache`); empty when it is off."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (``treadle info --json``)."""
        return {
            "versions": dict(self.versions),
            "fast_paths": {
                n: {"on": p.on, "reason": p.reason, "instead": p.instead}
                for n, p in self.paths.items()
            },
            "object_cache": dict(self.object_cache),
        }

    def __str__(self) -> str:
        lines = ["versions:"]
        lines += [f"  {k:<10} {v}" for k, v in self.versions.items()]
        lines.append("fast paths:")
        for p in self.paths.values():
            state = "on" if p.on else f"off: {p.reason} ({p.instead})"
            lines.append(f"  {p.name:<20} {state}")
        if c := self.object_cache:
            lines.append(
                f"object cache: {c['directory']} ({c['used_bytes']:,} of {c['max_bytes']:,} "
                "bytes used; TREADLE_CACHE_DIR, TREADLE_CACHE_BYTES)"
            )
            if look := c.get("lookahead"):
                lines.append(f"last lookahead: {look}")
        return "\n".join(lines)


def info() -> Info:
    """Versions and the state of every fast path (native decode, the compiled window loop,
    direct conversion, fixed-width reads, NVDEC, cached reads, image reads, the chunk cache,
    unflushed chunks, recorded video sizes), each probed now; a path that went off earlier
    in this process (one configuration refused, say) is reported off with that reason."""
    probes = {
        "native decode": _native_decode,
        "compiled window loop": _compiled_window_loop,
        "direct conversion": _direct_conversion,
        "fixed-width reads": _fixed_width_reads,
        "nvdec": _nvdec,
        "cached reads": _cached_reads,
        "image reads": lambda: None,  # per table (its pages' layout): off once one is not
        "chunk cache": _chunk_cache,
        "unflushed chunks": _unflushed_chunks,
        "recorded video sizes": lambda: None,  # per table: off once one plans without
    }
    found = {}
    for name, probe in probes.items():
        try:
            why = probe()
        except Exception as e:  # a probe that breaks says so; info itself never fails
            why = f"its probe failed ({type(e).__name__}: {e})"
        why = why or fastpaths.reasons().get(name)
        found[name] = FastPath(name, why is None, why, fastpaths.PATHS[name])
    return Info(_versions(), found, _object_cache())


def _versions() -> dict[str, str]:
    import importlib.metadata

    out = {"python": platform.python_version()}
    for pkg in _PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    import av

    out["ffmpeg"] = ".".join(map(str, av.library_versions.get("libavcodec", ()))) + " (avcodec)"
    from treadle.video.image_decode import decoder_name

    out["images"] = decoder_name()  # what decodes td.Video over JPEG/PNG/WebP columns
    return out


def _native_decode() -> str | None:
    from treadle.video import ffmpeg

    return ffmpeg.unavailable()


def _compiled_window_loop() -> str | None:
    from treadle.video import window_loop

    return window_loop.unavailable()


def _direct_conversion() -> str | None:
    from treadle.video.cpu_decode import direct_conversion_unavailable

    return direct_conversion_unavailable()


def _fixed_width_reads() -> str | None:
    """Write a 16-row local table with a 256-byte tensor column and read it back mapped."""
    from treadle.catalog.client import Client
    from treadle.read.fixed import FULL_ZIP_ROW_BYTES, FixedReader

    width = FULL_ZIP_ROW_BYTES // 4
    with tempfile.TemporaryDirectory(prefix="treadle-info-") as root:
        branch = Client(root).project("probe").branch("main")
        values = np.arange(16 * width, dtype=np.float32).reshape(16, width)
        branch.table("t").append_episode({"x": values}, episode="e")
        table = branch.table("t").pin()
        reader = FixedReader()
        try:
            path = reader.path(table, "x")
            same = np.array_equal(reader.read(table, [3, 0, 15], ["x"])["x"], values[[3, 0, 15]])
        finally:
            reader.close()
    if path != "mapped":
        return fastpaths.reasons().get("fixed-width reads") or f"a probe column is read by {path}"
    return None if same else "a probe column read back other values"


def _object_cache() -> dict[str, Any]:
    from treadle.storage.filecache import file_cache

    try:
        cache = file_cache()
    except ValueError:  # a bad TREADLE_CACHE_* setting: the `cached reads` path says which
        return {}
    if isinstance(cache, str):
        return {}
    from treadle.read.lookahead import LAST

    out = {"directory": str(cache.directory), "max_bytes": cache.max_bytes,
           "used_bytes": cache.used()}  # fmt: skip
    if LAST:  # the last loader with lookahead: hit rate, bytes and requests per sample
        out["lookahead"] = dict(LAST)
    return out


def _chunk_cache() -> str | None:
    """Whether this process's environment configures a usable chunk cache (lookahead)."""
    from treadle.storage.chunkstore import chunk_store

    got = chunk_store()
    return got if isinstance(got, str) else None


def _unflushed_chunks() -> str | None:
    """Whether the chunk cache can skip flushing its fetches (the machine has a boot id)."""
    from treadle.storage.chunkfiles import NO_BOOT_ID, boot_id

    return None if boot_id() else NO_BOOT_ID


def _cached_reads() -> str | None:
    """Whether this process's environment configures a usable object cache."""
    from treadle.storage.filecache import file_cache

    cache = file_cache()
    return cache if isinstance(cache, str) else None


def _nvdec() -> str | None:
    import torch

    from treadle.gpu.backend import cuda_unavailable, nvdec_unavailable

    why = cuda_unavailable(torch.device("cuda"))
    return why if why is not None else nvdec_unavailable(torch.cuda.current_device())
