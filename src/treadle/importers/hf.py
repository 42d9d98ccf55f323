"""Import a Hugging Face ``datasets`` dataset: ``save_to_disk`` output, or parquet/arrow files.

Nothing here imports ``datasets``. A ``save_to_disk`` folder holds ``state.json`` (its
``_data_files`` name Arrow IPC *stream* files) and ``dataset_info.json``; a
``DatasetDict`` folder holds ``dataset_dict.json`` and one such folder per split. The
Arrow files are memory-mapped and their record batches go to the table as they are
(zero-copy) unless a column needs work:

- ``Image`` features (``struct<bytes, path>``): ``images="encoded"`` keeps the encoded
  bytes as a ``large_binary`` column, ``images="decoded"`` stores ``uint8 [H, W, 3]``
  tensors (one shape per column), decoded on a thread pool: batches are cut at 32 MiB of
  pixels (each image counted from its header) and at most ``IN_FLIGHT_BYTES`` (512 MiB)
  decode at once; Pillow's own limit (``PIL.Image.MAX_IMAGE_PIXELS``) bounds one image.
- Arrow extension types (``Array2D``...) are stored as their storage type.

The Hugging Face schema metadata is dropped (the table has its own).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from treadle.errors import CorruptData, NotFound, SchemaMismatch
from treadle.importers.arrow import DEFAULT_CHUNK_ROWS, IN_FLIGHT_BYTES, check_rename
from treadle.importers.executor import Executor, pick
from treadle.importers.hf_convert import convert_batch, pixel_slices
from treadle.importers.parquet_bounded import MAX_ROW_BYTES, Limits, bounded_batches
from treadle.importers.parquet_pages import MAX_PAGE_BYTES
from treadle.importers.run import (
    ImportOptions,
    ImportResult,
    Progress,
    append_tables,
    import_id,
    run_import,
)
from treadle.importers.sources import Source, SourceFile, identities, split_url
from treadle.read.prefetch import ordered_map
from treadle.table.casts import exact_cast

if TYPE_CHECKING:
    from treadle.catalog.client import Project


@dataclass(frozen=True)
class HfFile(SourceFile):
    """One data file of the dataset."""

    kind: str  # "arrow" or "parquet"


def resolve_files(
    paths: Sequence[str] | str,
    split: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[HfFile]:
    """The data files of a ``save_to_disk`` folder (or DatasetDict split), or given files."""
    if isinstance(paths, str):
        paths = [paths]
    out: list[HfFile] = []
    for p in paths:
        p = str(p).rstrip("/")
        if p.endswith((".arrow", ".parquet")):
            root, name = split_url(p)
            out.append(HfFile(Source(root, storage_options), name, _kind(name)))
            continue
        src = Source(p, storage_options)
        out.extend(_folder_files(src, split))
    if not out:
        raise NotFound(f"no Arrow or parquet files in {list(paths)}")
    return out


def _kind(name: str) -> str:
    return "parquet" if name.endswith(".parquet") else "arrow"


def _folder_files(src: Source, split: str | None, prefix: str = "") -> list[HfFile]:
    rel = (lambda n: f"{prefix}/{n}") if prefix else (lambda n: n)
    if src.exists(rel("dataset_dict.json")):
        try:
            splits = json.loads(src.read(rel("dataset_dict.json")))["splits"]
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptData(
                f"{src.describe(rel('dataset_dict.json'))}: malformed ({e})"
            ) from None
        if split is None:
            if len(splits) == 1:
                split = splits[0]
            elif "train" in splits:
                split = "train"
            else:
                raise SchemaMismatch(
                    f"{src.describe(prefix)} is a DatasetDict with splits {splits}: pick one "
                    "with split=... (--split on the command line)"
                )
        if split not in splits:
            raise NotFound(f"{src.describe(prefix)} has no split {split!r} (it has {splits})")
        return _folder_files(src, None, rel(split))
    if src.exists(rel("state.json")):
        try:
            state = json.loads(src.read(rel("state.json")))
            names = [f["filename"] for f in state["_data_files"]]
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptData(f"{src.describe(rel('state.json'))}: malformed ({e})") from None
        return [HfFile(src, rel(n), _kind(n)) for n in names]
    names = [n for n in src.list(prefix) if n.endswith((".arrow", ".parquet"))]
    if not names:
        raise NotFound(
            f"{src.describe(prefix)} has no state.json, dataset_dict.json, .arrow or .parquet files"
        )
    return [HfFile(src, n, _kind(n)) for n in names]


def _features(schema: pa.Schema) -> dict[str, Any]:
    meta = schema.metadata or {}
    raw = meta.get(b"huggingface")
    if not raw:
        return {}
    try:
        info = json.loads(raw)
        return dict(info.get("info", {}).get("features", {}) or {})
    except (ValueError, AttributeError):
        return {}


def _class_labels(features: dict[str, Any]) -> dict[str, Any]:
    """Field -> the names of its ``ClassLabel`` feature (what each integer means)."""
    return {
        k: f.get("names")
        for k, f in features.items()
        if isinstance(f, dict) and f.get("_type") == "ClassLabel"
    }


def file_batches(f: HfFile, chunk_rows: int, limits: Limits = Limits()) -> Iterator[pa.RecordBatch]:
    """Record batches of one file (memory-mapped for local Arrow files), each validated: an
    Arrow file's buffers are taken as they are, and an offset past its data would read
    beyond it (a corrupt batch is :class:`CorruptData` naming the file and the batch)."""
    for j, batch in enumerate(_file_batches(f, chunk_rows, limits)):
        try:
            batch.validate(full=True)
        except pa.ArrowInvalid as e:
            raise CorruptData(f"HF data file {f.describe()}, batch {j} is corrupt: {e}") from None
        yield batch


def _file_batches(f: HfFile, chunk_rows: int, limits: Limits) -> Iterator[pa.RecordBatch]:
    where = f.describe()
    try:
        if f.kind == "parquet":
            yield from bounded_batches(
                _parquet_opener(f), chunk_rows, where=f"HF data file {where}", limits=limits
            )
            return
        if not f.source.url:
            mm = pa.memory_map(str(f.source.local_path(f.name)))
        else:
            mm = pa.PythonFile(f.source.open(f.name), mode="r")
        try:
            reader = pa.ipc.open_stream(mm)
            yield from reader
        except pa.ArrowInvalid:
            if f.source.url:
                raise
            mm = pa.memory_map(str(f.source.local_path(f.name)))
            reader = pa.ipc.open_file(mm)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
    except FileNotFoundError:
        raise NotFound(f"HF data file {where} does not exist") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptData(f"HF data file {where} is corrupt or truncated: {e}") from None


def iter_batches(
    files: Sequence[HfFile],
    opts: ImportOptions | None = None,
    *,
    threads: int | None = None,
    limits: Limits = Limits(),
) -> Iterator[pa.Table]:
    """Tables of the dataset's rows, file by file (zero-copy unless images are decoded);
    ``limits`` bound what a parquet file may make the reader hold."""
    opts = opts or ImportOptions()
    chunk_rows, images = opts.chunk_rows, opts.images
    state: dict[str, Any] = {"schema": None}

    labels: dict[str, Any] | None = None  # the first file's ClassLabel names per field

    def batches() -> Iterator[tuple[pa.RecordBatch, dict[str, Any], str, int]]:
        nonlocal labels
        for f in files:
            features: dict[str, Any] | None = None
            for j, b in enumerate(file_batches(f, chunk_rows, limits)):
                if features is None:
                    if labels is None:  # every file has the first one's columns
                        check_rename(opts.rename, b.schema.names, f"HF file {f.describe()}")
                    features = _features(b.schema)
                    if not features and f.kind == "parquet":
                        features = _features(pq.read_schema(_parquet_handle(f)))
                    mine = _class_labels(features)
                    labels = mine if labels is None else labels
                    for col in sorted(mine.keys() & labels.keys()):
                        if mine[col] != labels[col]:
                            raise SchemaMismatch(
                                f"HF file {f.describe()}: field {col} has class labels "
                                f"{mine[col]}, earlier files {labels[col]}: its integers mean "
                                "other classes"
                            )
                where = f"HF file {f.describe()}, batch {j}"
                if images != "decoded":
                    yield b, features, where, 0
                    continue
                for start, piece, size in pixel_slices(b, features):
                    yield piece, features, f"{where}{f' from row {start}' if start else ''}", size

    def conv(item: tuple[pa.RecordBatch, dict[str, Any], str, int]) -> tuple[pa.Table, str]:
        b, features, where, _ = item
        return convert_batch(b, features, images, where, opts.rename), where

    for table, where in ordered_map(
        conv,
        batches(),
        threads if images == "decoded" else 1,
        weight=lambda item: item[3],
        budget=IN_FLIGHT_BYTES,
        leave_running=True,
    ):
        if state["schema"] is None:
            state["schema"] = table.schema
        elif not table.schema.equals(state["schema"]):
            table = _conform(table, state["schema"], where)
        yield table


def _conform(table: pa.Table, have: pa.Schema, where: str) -> pa.Table:
    """``table`` in the earlier files' schema ``have``, its values unchanged, else an error."""
    if table.schema.names != have.names:
        raise SchemaMismatch(f"{where}: columns {table.schema} differ from earlier files' {have}")
    return pa.Table.from_arrays(
        [
            exact_cast(
                table.column(f.name),
                f.type,
                f"{where}: field {f.name}",
                f" (the column type of earlier files is {f.type})",
            )
            for f in have
        ],
        schema=have,
    )


def _parquet_handle(f: HfFile) -> Any:
    return _parquet_opener(f)()


def _parquet_opener(f: HfFile) -> Any:
    """A function giving a fresh handle to the parquet file (an object is read once)."""
    if f.source.url:
        data = f.source.read(f.name)
        return lambda: pa.BufferReader(data)
    path = str(f.source.local_path(f.name))
    return lambda: path


def import_hf(
    paths: Sequence[str] | str,
    project: Project,
    table: str,
    *,
    branch: str | None = None,
    split: str | None = None,
    images: str = "encoded",
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    client: Any = None,
    root: str | None = None,
    progress: bool | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    allow_pickle: bool = False,
    rename: dict[str, str] | None = None,
    executor: Executor | None = None,
    max_page_bytes: int = MAX_PAGE_BYTES,
    max_row_bytes: int = MAX_ROW_BYTES,
) -> ImportResult:
    """Import a ``save_to_disk`` folder (``split=`` for a DatasetDict) or parquet/arrow files.

    A DatasetDict without ``split`` imports its only split, else ``train``.

    A parquet page that decompresses to more than ``max_page_bytes`` (default 1 GiB), or a
    row whose list columns make the reader hold more than ``max_row_bytes`` (default 1 GiB:
    values at their width, a string at its dictionary page's size), stops the import with
    :class:`~treadle.errors.UnsafeInput` naming the file, column and row group, before it is
    decoded (a few KB of parquet may say either).

    One commit on ``branch``. ``allow_pickle`` is accepted for a uniform CLI; nothing in
    these formats is ever unpickled. ``executor=td.RayExecutor()`` stages each file as a
    Ray task and commits once here.
    """
    limits = Limits(max_page_bytes, max_row_bytes)
    return _import(paths, project, table, ImportOptions.of(locals()), split, limits)


def _import(
    paths: Sequence[str] | str,
    project: Project,
    table: str,
    opts: ImportOptions,
    split: str | None,
    limits: Limits = Limits(),
) -> ImportResult:
    files = resolve_files(paths, split, opts.source_options)
    br = opts.open_branch(project)
    ids = identities(files)
    missing = [f.describe() for f, i in zip(files, ids) if i is None]
    if missing:
        raise NotFound(f"HF data file {missing[0]} does not exist")
    sizes = [i[0] for i in ids if i is not None]
    names = [f.describe() for f in files]
    iid = import_id("hf", names, ids, opts.id_options("images", "rename", split=split))
    conv = opts.for_sources()

    def write(tw: Any, bar: Progress, only: Sequence[int] | None = None) -> tuple[int, int, int]:
        tables = iter_batches(pick(files, only), conv, limits=limits)
        return append_tables(tw, bar, tables), 0, sum(pick(sizes, only))

    return run_import(
        opts,
        br,
        table,
        fmt="hf",
        iid=iid,
        what=f"{len(files)} file(s) from {files[0].source.root}",
        write=write,
        total=None,
        unit="row",
        sources=names,
    )
