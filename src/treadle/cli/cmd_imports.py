"""``treadle import {webdataset,mds,lerobot,hf,rlds,hdf5,zarr,ros2} SRC... --project P --table T``.

Each sub-command sets ``args.func`` to :func:`run`, which takes ``args`` and returns an exit
code; the importers themselves load when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from treadle.cli.args import float_at_least, key_value
from treadle.errors import TreadleError


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``import`` command (with one sub-command per format) to ``subparsers``."""
    p = subparsers.add_parser(
        "import",
        help="convert WebDataset / MDS / LeRobot / Hugging Face / RLDS / HDF5 / Zarr / ROS bag "
        "data into a table (one commit)",
        description="Import a dataset into a table of a project, as one commit. Re-running "
        "after a crash is safe: nothing is committed until the end, and an import already "
        "committed is not repeated.",
    )
    sub = p.add_subparsers(dest="format", metavar="FORMAT", required=True)
    helps = {
        "webdataset": "tar shards: paths, folders, s3://... URLs (a prefix ends in /), brace patterns",
        "mds": "MosaicML Streaming folder or URL with index.json",
        "lerobot": "LeRobot dataset root (v3.0 or v2.1)",
        "hf": "Hugging Face save_to_disk folder, or parquet/arrow files",
        "rlds": "RLDS / TFDS dataset version folder or URL (e.g. .../bridge/1.0.0)",
        "hdf5": "robomimic/LIBERO/ALOHA HDF5 file, or a folder of them",
        "zarr": "Diffusion Policy / UMI ReplayBuffer: a Zarr folder or .zip",
        "ros2": "ROS 2 bag folder, .mcap or ROS 1 .bag file, or a folder of bags",
    }
    for fmt, h in helps.items():
        _add_format(sub, fmt, h)
    return p


def _add_format(sub: Any, fmt: str, h: str) -> None:
    """``treadle import FMT``: the options every format takes, then its own."""
    sp = sub.add_parser(fmt, help=h, description=h)
    sp.add_argument("src", nargs="+", metavar="SRC", help="source: " + h)
    sp.add_argument("--project", required=True, help="project to import into")
    sp.add_argument("--table", required=True, help="table to create or append to")
    sp.add_argument(
        "--branch", default=None, help="branch to commit on (default: main; created if new)"
    )
    sp.add_argument(
        "--allow-pickle",
        action="store_true",
        help="unpickle .pyd/.pickle/.pth members and MDS pkl columns (runs code from the "
        "data: only for data you trust)",
    )
    video = fmt in ("rlds", *ROBOT_FORMATS)  # cameras as H.264 by default
    sp.add_argument(
        "--images",
        choices=["video", "encoded", "decoded"] if video else ["encoded", "decoded"],
        default="video" if video else "encoded",
        help="store cameras as H.264 video per episode and camera (PSNR reported; needs a "
        "frame rate), encoded images, or uint8 [H,W,3] tensors"
        if video
        else "keep images encoded (bytes) or store uint8 [H,W,3] tensors",
    )
    sp.add_argument(
        "--rename",
        action="append",
        default=[],
        metavar="SRC=DST",
        help="store source column SRC as table column DST (repeatable)",
    )
    sp.add_argument(
        "--source-option",
        action="append",
        type=key_value,
        default=[],
        metavar="KEY=VALUE",
        help="an object-store option for s3:// (gs://, az://) sources, like "
        "--storage-option for the store (repeatable)",
    )
    _add_format_options(sp, fmt)
    sp.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="stage every source as a Ray task (on the cluster at ADDRESS, default: the "
        "local or $RAY_ADDRESS one) and commit once here; needs pip install 'treadle[ray]'",
    )
    sp.add_argument("--no-progress", action="store_true", help="same as --quiet")
    sp.set_defaults(func=run)


#: formats whose cameras may be stored as video (``--images video``, the default)
ROBOT_FORMATS = ("hdf5", "zarr", "ros2")


def _add_hf_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--split",
        default=None,
        help="split of a DatasetDict (default: its only split, else train)",
    )
    sp.add_argument(
        "--max-page-bytes",
        type=byte_count,
        default=None,
        help="the largest parquet page read, uncompressed (default 1G)",
    )
    sp.add_argument(
        "--max-row-bytes",
        type=byte_count,
        default=None,
        help="the most a parquet row's list columns may make the reader hold (default 1G)",
    )


def _add_lerobot_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--tolerance-s",
        type=float_at_least(0),
        default=1e-4,
        help="largest gap in seconds between a frame's timestamp and its video "
        "frame's (>= 0; default 1e-4)",
    )
    sp.add_argument(
        "--max-meta-bytes",
        type=byte_count,
        default=None,
        help="the largest meta/ JSON file read (each is parsed whole), and the most a "
        "metadata parquet file's columns used may decode to (default 256M)",
    )


def _add_format_options(sp: argparse.ArgumentParser, fmt: str) -> None:
    """The options only some formats take."""
    if fmt == "ros2":
        _add_ros2_options(sp)
    elif fmt in ROBOT_FORMATS:
        default = "env_args control_freq" if fmt == "hdf5" else "none; needed for video"
        sp.add_argument("--fps", type=float_at_least(0), default=None,
                        help=f"the episodes' rate (default: {default})")  # fmt: skip
    if fmt == "hdf5":
        sp.add_argument("--next-obs", action="store_true", help="also import next_obs/*")
    if fmt == "hf":
        _add_hf_options(sp)
    if fmt == "rlds":
        sp.add_argument("--split", default="train", help="the split (default train)")
        sp.add_argument(
            "--fps",
            type=float_at_least(0),
            default=None,
            help="the table's frame rate (RLDS stores none); needed with --images video",
        )
        sp.add_argument(
            "--pixels",
            choices=["pillow", "tfds"],
            default="pillow",
            help="decode JPEGs (--images video/decoded) as Pillow does (accurate IDCT) or as "
            "TFDS does (TF's default fast IDCT, the pixels tf.data pipelines trained on)",
        )
    if fmt == "lerobot":
        _add_lerobot_options(sp)
    if fmt in ("webdataset", "mds"):
        sp.add_argument(
            "--json-as",
            choices=["typed", "text"],
            default="typed",
            help="store JSON as Arrow values (typed) or as its text (for JSON whose "
            "fields or types vary between samples)",
        )
        what = (
            "the most bytes a compressed shard may inflate to (default 2G)"
            if fmt == "webdataset"
            else "the largest uncompressed shard read; each is held in memory (default 1G)"
        )
        sp.add_argument("--max-shard-bytes", type=byte_count, default=None, help=what)
    if fmt == "webdataset":
        sp.add_argument(
            "--max-member-bytes",
            type=byte_count,
            default=None,
            help="the largest tar member read; each is held in memory (default 1G)",
        )


def _add_ros2_options(sp: argparse.ArgumentParser) -> None:
    """``treadle import ros2``: topics, the clock, alignment and stamps."""
    sp.add_argument("--topic", action="append", required=True, metavar="TOPIC[:FIELD]=COLUMN",
                    help="a topic (or a field of it) and its column (repeatable)")  # fmt: skip
    sp.add_argument("--fps", required=True, help="the clock's rate: 30, or 30000/1001")
    sp.add_argument("--align", action="append", default=[], metavar="COLUMN=linear|next",
                    help="interpolate, or take the next message, for COLUMN (default: hold)")  # fmt: skip
    sp.add_argument("--stamp", action="append", default=[], metavar="header|log|TOPIC=log",
                    help="message times: header stamps (default) or log times, for all "
                    "topics or one (repeatable)")  # fmt: skip


def _pairs(items: list[str], option: str, form: str = "KEY=VALUE") -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.rpartition("=")
        if not sep or not key or not value:
            raise ValueError(f"{option} takes {form}, got {item!r}")
        if key in out:  # else the last one silently wins
            raise ValueError(f"{option} {key} is given twice ({out[key]!r} and {value!r})")
        out[key] = value
    return out


def _ros2(args: argparse.Namespace, common: dict[str, Any]) -> Any:
    from treadle import importers

    everywhere = [s for s in args.stamp if "=" not in s]
    stamp: Any = _pairs([s for s in args.stamp if "=" in s], "--stamp")
    if everywhere and stamp:
        raise ValueError("--stamp: give header|log for every topic, or TOPIC=log, not both")
    if everywhere:
        stamp = everywhere[-1]
    common = {k: v for k, v in common.items() if k != "rename"}
    topics = _pairs(args.topic, "--topic", "TOPIC[:FIELD]=COLUMN")
    align = _pairs(args.align, "--align", "COLUMN=linear|next")
    return importers.ros2(
        args.src[0], args.project, args.table, topics=topics,
        fps=args.fps, align=align, stamp=stamp or "header", **common,
    )  # fmt: skip


def byte_count(text: str) -> int:
    """``"64M"``, ``"2G"``, ``"1048576"`` -> bytes (K/M/G/T are powers of 1024)."""
    units = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        n = int(float(num) * (1 << units[unit]))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 512M, 2G)") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"a byte count must be > 0, got {text!r}")
    return n


def run(args: argparse.Namespace) -> int:
    """Run one ``treadle import`` command; prints a JSON summary line (the command's data,
    with or without ``--json``), returns an exit code."""
    from treadle.catalog import Client

    rename = {}
    for item in args.rename:
        src, sep, dst = item.partition("=")
        if not sep or not src or not dst:
            print(f"treadle import {args.format}: error: --rename takes SRC=DST, got {item!r}",
                  file=sys.stderr)  # fmt: skip
            return 2
        rename[src] = dst
    common: dict[str, Any] = {
        "rename": rename or None,
        "branch": args.branch,
        "source_options": dict(args.source_option) or None,
        "images": args.images,
        "allow_pickle": args.allow_pickle,
        "progress": False if args.no_progress or getattr(args, "quiet", False) else None,
    }
    for opt in (
        "max_shard_bytes",
        "max_member_bytes",
        "max_meta_bytes",
        "max_page_bytes",
        "max_row_bytes",
        "json_as",
    ):
        if getattr(args, opt, None) is not None:
            common[opt] = getattr(args, opt)
    if args.format in ("mds", "lerobot", "rlds", *ROBOT_FORMATS) and len(args.src) != 1:
        print(f"treadle import {args.format}: error: give exactly one SRC", file=sys.stderr)
        return 2
    if args.format == "rlds" and args.pixels == "tfds" and args.images == "encoded":
        print("treadle import rlds: error: --pixels tfds decodes for --images video or "
              "decoded; encoded images are decoded by the loader", file=sys.stderr)  # fmt: skip
        return 2
    if args.format == "rlds" and args.images == "video" and args.fps is None:
        print("treadle import rlds: error: --images video (the default) needs --fps "
              "(RLDS stores no frame rate), or use --images encoded", file=sys.stderr)  # fmt: skip
        return 2
    try:
        # an import is a write: like the demo, it makes a root folder that is not there yet
        common["client"] = Client(args.root, args.storage_options or None, create=True)
        res = _import(args, common)
    except (TreadleError, ValueError) as e:  # one line, like argparse's errors, with its kind
        # an error of the source names --source-option itself (importers.sources), one of
        # the store --storage-option: which store an error is about is known only where raised
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"treadle import {args.format}: error: {type(e).__name__}: {first}", file=sys.stderr)
        return 1
    print(json.dumps(_summary(res)))
    return 0


def _summary(res: Any) -> dict[str, Any]:
    """The JSON summary line of an import result."""
    summary = {
        "commit": res.commit.short_id if res.commit is not None else None,
        "table": res.table,
        "rows": res.rows,
        "episodes": res.episodes,
        "seconds": round(res.seconds, 3),
        "import_id": res.import_id,
        "already_imported": res.skipped,
    }
    if res.videos is not None:  # LeRobot: per episode and camera, copied or re-encoded (why)
        summary["videos"] = res.videos
    if res.cameras is not None:  # RLDS and robot formats: per camera, bytes and PSNR
        summary["cameras"] = res.cameras
    if res.topics:  # ROS bags: per bag and topic, messages, rate, gaps, messages used
        summary["topics"] = res.topics
    return summary


def _import(args: argparse.Namespace, common: dict[str, Any]) -> Any:
    """Run the importer of ``args.format`` with the options every format shares."""
    from treadle import importers
    from treadle.importers.ray_executor import RayExecutor

    if getattr(args, "ray", None) is not None:
        common["executor"] = RayExecutor(address=args.ray or None)
    if args.format == "webdataset":
        return importers.webdataset(args.src, args.project, args.table, **common)
    if args.format == "hf":
        return importers.hf(args.src, args.project, args.table, split=args.split, **common)
    if args.format == "mds":
        return importers.mds(args.src[0], args.project, args.table, **common)
    if args.format == "rlds":
        return importers.rlds(
            args.src[0],
            args.project,
            args.table,
            split=args.split,
            fps=args.fps,
            pixels=args.pixels,
            **common,
        )
    if args.format == "hdf5":
        return importers.hdf5(args.src[0], args.project, args.table, fps=args.fps,
                              next_obs=args.next_obs, **common)  # fmt: skip
    if args.format == "ros2":
        return _ros2(args, common)
    if args.format == "zarr":
        return importers.zarr(args.src[0], args.project, args.table, fps=args.fps, **common)
    return importers.lerobot(
        args.src[0], args.project, args.table, tolerance_s=args.tolerance_s, **common
    )
