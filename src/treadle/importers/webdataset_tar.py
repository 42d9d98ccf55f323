"""WebDataset tar shards: finding them, and reading their samples (``{ext: bytes}``).

The tar files are read with Python's :mod:`tarfile` in streaming mode (``r|*``: plain
or compressed tar, forward-only, bounded memory). Members are grouped into samples by
key (the member path up to the first dot of its base name, as WebDataset does).

A member is read whole, so one larger than ``max_member_bytes`` (default 1 GiB) is
refused from its tar header, before it is read, and so is a sparse member (a few bytes in
the shard, up to ``max_member_bytes`` of zeros each when read); a compressed shard (``.tar.gz``,
``.tar.bz2``, ``.tar.xz``) is refused once it inflates past ``max_shard_bytes``
(default 2 GiB). Both errors (:class:`UnsafeInput`) name the shard. A truncated or
corrupt tar is :class:`CorruptData` naming the shard and the last sample read.
"""

from __future__ import annotations

import collections
import io
import os
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from treadle.errors import CorruptData, InvalidName, NotFound, UnsafeInput
from treadle.importers._inflate import DECOMPRESS_ERRORS, open_capped
from treadle.importers.sources import Source, SourceFile, expand_braces, is_url, split_url

#: default ``max_member_bytes``: the largest tar member read (each is held whole)
MAX_MEMBER_BYTES = 1 << 30
#: default ``max_shard_bytes``: the most bytes a compressed shard may inflate to
MAX_SHARD_BYTES = 2 << 30


@dataclass(frozen=True)
class Shard(SourceFile):
    """One tar shard: the source it lives in and its name there."""


def resolve_shards(
    srcs: Sequence[str] | str, storage_options: dict[str, Any] | None = None
) -> list[Shard]:
    """Expand paths, folders (every ``*.tar`` in them), URLs, URL prefixes ending in ``/``
    (every ``*.tar`` under them) and brace patterns to shards."""
    if isinstance(srcs, str):
        srcs = [srcs]
    out: list[Shard] = []
    sources: dict[str, Source] = {}
    for pattern in srcs:
        if str(pattern).startswith("pipe:"):
            raise InvalidName(f"{pattern!r}: 'pipe:' sources run shell commands and are refused")
        for path in expand_braces(str(pattern)):
            url = is_url(path)
            if (not url and os.path.isdir(path)) or (url and path.endswith("/")):
                src = sources.setdefault(path, Source(path, storage_options if url else None))
                names = [n for n in src.list() if is_tar(n)]
                if not names:
                    where = f"under {path!r}" if url else f"in folder {path!r}"
                    raise NotFound(f"no .tar shards {where}")
                out.extend(Shard(src, n) for n in names)
                continue
            root, name = split_url(path)
            src = sources.get(root) or sources.setdefault(root, Source(root, storage_options))
            out.append(Shard(src, name))
    if not out:
        raise NotFound("no WebDataset shards given")
    return out


def is_tar(name: str) -> bool:
    """True for a shard's name: ``.tar``, ``.tar.gz`` or ``.tgz``."""
    return name.endswith((".tar", ".tar.gz", ".tgz"))


def split_key(path: str) -> tuple[str, str]:
    """``(key, ext)`` of a member path, as WebDataset splits it (first dot of the base name)."""
    d, _, base = path.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot:
        return path, ""
    return (f"{d}/{stem}" if d else stem), ext


def iter_raw_samples(
    shard: Shard,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Iterator[dict[str, Any]]:
    """Samples of one shard as ``{"__key__": str, ext: bytes, ...}``, in tar order.

    A truncated or corrupt tar raises :class:`CorruptData` naming the shard and the last
    sample read; a member over ``max_member_bytes``, or a compressed shard inflating past
    ``max_shard_bytes``, raises :class:`UnsafeInput` naming the shard.
    """
    where = shard.describe()
    current: dict[str, Any] | None = None
    last = "(start)"
    try:
        with shard.source.open(shard.name) as raw:
            f = _Tail(open_capped(raw, max_shard_bytes, f"shard {where}", "max_shard_bytes"))
            with tarfile.open(fileobj=f, mode="r|") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    key, ext = split_key(member.name)
                    if not ext or key.rsplit("/", 1)[-1].startswith("__"):
                        continue  # no extension or a WebDataset metadata member
                    _check_member(member, where, max_member_bytes)
                    fobj = tar.extractfile(member)
                    data = fobj.read() if fobj is not None else b""
                    if len(data) != member.size:
                        raise CorruptData(
                            f"shard {where}: member {member.name!r} is truncated "
                            f"({len(data)} of {member.size} bytes)"
                        )
                    if current is not None and current["__key__"] != key:
                        last = current["__key__"]
                        yield current
                        current = None
                    if current is None:
                        current = {"__key__": key}
                    if ext in current:
                        raise CorruptData(f"shard {where}: sample {key!r} has two {ext!r} members")
                    current[ext] = data
                if f.block(tar.offset) != _ZERO_BLOCK:
                    last = current["__key__"] if current is not None else last
                    raise tarfile.ReadError(
                        f"no end-of-archive block at byte {tar.offset:,} (the shard was cut "
                        "there, or holds no tar header)"
                    )
    except (tarfile.TarError, EOFError, OSError, *DECOMPRESS_ERRORS) as e:
        after = f" after sample {last!r}" if last != "(start)" else ""
        raise CorruptData(
            f"shard {where} is truncated or not a tar file{after}: {type(e).__name__}: {e}"
        ) from None
    if current is not None:
        yield current


def _check_member(member: tarfile.TarInfo, where: str, max_member_bytes: int) -> None:
    """Refuse, from its header, a member over ``max_member_bytes`` or a sparse one."""
    if member.issparse():
        raise UnsafeInput(
            f"shard {where}: member {member.name!r} is a sparse file: {member.size:,} bytes "
            "mostly absent from the shard, filled in as zeros when read (a bomb: WebDataset "
            "shards hold no sparse members)"
        )
    if member.size > max_member_bytes:
        raise UnsafeInput(
            f"shard {where}: member {member.name!r} holds {member.size:,} bytes, "
            f"more than max_member_bytes={max_member_bytes:,} (raise it if you "
            "trust this shard)"
        )


_ZERO_BLOCK = bytes(tarfile.BLOCKSIZE)


class _Tail(io.RawIOBase):
    """Reads ``inner``, keeping its last few chunks, so that the block where tarfile saw the
    archive end can be checked: tarfile ends quietly at the end of the data, at a cut
    header or at garbage where a header should be, not only at the end-of-archive block."""

    #: bytes kept: more than tarfile reads ahead of the header it is parsing (10 KiB)
    KEEP = 64 << 10

    def __init__(self, inner: Any):
        self._inner, self._pos, self._kept = inner, 0, 0
        self._chunks: collections.deque[tuple[int, bytes]] = collections.deque()

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._inner.read(len(b))
        n = len(data)
        b[:n] = data
        if n:
            self._chunks.append((self._pos, bytes(data)))
            self._pos += n
            self._kept += n
            while self._kept - len(self._chunks[0][1]) >= self.KEEP:
                self._kept -= len(self._chunks.popleft()[1])
        return n

    def block(self, offset: int) -> bytes | None:
        """The (up to) 512 bytes at ``offset``, if still kept; b"" past the end."""
        if offset >= self._pos:
            return b""
        kept = b"".join(c for _, c in self._chunks)
        start = offset - (self._chunks[0][0] if self._chunks else self._pos)
        return kept[start : start + tarfile.BLOCKSIZE] if start >= 0 else None
