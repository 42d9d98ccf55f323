"""RLDS import throughput: treadle (``encoded`` and ``video``) against TFDS's own reader.

One RLDS folder (a TFDS version folder: ``dataset_info.json``, ``features.json`` as TFDS
writes it, TFRecord shards of one ``tf.train.Example`` per episode, two 128x128 JPEG
cameras, 8-D state, 7-D action, an instruction) is written once under
``bench/data/rlds-<episodes>/`` with treadle's own writer (protobuf; no TensorFlow needed).
Then, timed end to end, in interleaved rounds:

- treadle ``images="encoded"`` and ``images="video"`` (fps 10) into a fresh table each time
  (``python bench/case_import_rlds.py``);
- with ``--tfds-python PY`` (a Python with ``tensorflow-datasets``; TensorFlow is not part
  of treadle's environments), TFDS's own reader iterating the same shards in file order
  (``builder_from_directory(...).as_dataset("train", shuffle_files=False,
  read_config=ReadConfig(interleave_cycle_length=1))`` and ``tfds.as_numpy`` of every
  step), once with the images decoded (TFDS's default) and once with ``SkipDecoding``
  (bytes), each timed on its second pass over the shards (the first traces TF's graphs):
  run as ``PY bench/case_import_rlds.py --tfds-only DIR`` in a subprocess, which imports no
  treadle.

Rates are episodes/s and source MB/s (median of the rounds); each line is also printed as
JSON.

    python bench/case_import_rlds.py [--tiny] [--runs 3] [--tfds-python /tmp/tfvenv/bin/python]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SIDE = 128
CLASS = "tensorflow_datasets.core.features."


def sizes(tiny: bool) -> dict[str, int]:
    return (
        {"episodes": 8, "steps": 20, "shards": 2}
        if tiny
        else {"episodes": 96, "steps": 60, "shards": 8}
    )


def _tensor(*shape: int, dtype: str = "float32") -> dict:
    return {
        "pythonClassName": CLASS + "tensor_feature.Tensor",
        "tensor": {
            "dtype": dtype,
            "encoding": "none",
            "shape": {"dimensions": [str(d) for d in shape]},
        },
    }


def _features() -> dict:
    image = {
        "pythonClassName": CLASS + "image_feature.Image",
        "image": {"dtype": "uint8", "encodingFormat": "jpeg",
                  "shape": {"dimensions": [str(SIDE), str(SIDE), "3"]}},
    }  # fmt: skip
    text = {"pythonClassName": CLASS + "text_feature.Text", "text": {}}
    obs = {"image": image, "wrist_image": image, "state": _tensor(8)}
    steps = {
        "observation": {"pythonClassName": CLASS + "features_dict.FeaturesDict",
                        "featuresDict": {"features": obs}},
        "action": _tensor(7), "is_first": _tensor(dtype="bool"), "is_last": _tensor(dtype="bool"),
        "language_instruction": text,
    }  # fmt: skip
    return {
        "pythonClassName": CLASS + "features_dict.FeaturesDict",
        "featuresDict": {"features": {
            "steps": {"pythonClassName": CLASS + "dataset_feature.Dataset",
                      "sequence": {"feature": {"pythonClassName": CLASS + "features_dict.FeaturesDict",
                                               "featuresDict": {"features": steps}}, "length": "-1"}},
            "episode_metadata": {"pythonClassName": CLASS + "features_dict.FeaturesDict",
                                 "featuresDict": {"features": {"file_path": text}}},
        }},
    }  # fmt: skip


def _jpeg(t: int, seed: int) -> bytes:
    from PIL import Image

    y, x = np.mgrid[0:SIDE, 0:SIDE]
    rgb = np.stack([128 + 90 * np.sin(x / 11 + t / 6 + seed), 128 + 90 * np.cos(y / 9 - t / 6),
                    128 + 60 * np.sin((x + y) / 17 + seed)], axis=-1).astype(np.uint8)  # fmt: skip
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "JPEG", quality=95)
    return out.getvalue()


def generate(tiny: bool) -> Path:
    """The RLDS folder (written once); returns its path."""
    from treadle.importers.rlds.example_proto import example_class
    from treadle.importers.rlds.tfrecord import frame_record

    sz = sizes(tiny)
    folder = HERE / "data" / f"rlds-{sz['episodes']}" / "bench_rlds" / "1.0.0"
    if (folder / ".done").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per = np.array_split(np.arange(sz["episodes"]), sz["shards"])
    n = sz["steps"]
    for s, eps in enumerate(per):
        with open(folder / f"bench_rlds-train.tfrecord-{s:05d}-of-{sz['shards']:05d}", "wb") as f:
            for e in eps:
                ex = example_class()()
                feat = ex.features.feature
                feat["steps/observation/image"].bytes_list.value.extend(
                    _jpeg(t, e) for t in range(n)
                )
                feat["steps/observation/wrist_image"].bytes_list.value.extend(
                    _jpeg(2 * t, e + 50) for t in range(n)
                )
                feat["steps/observation/state"].float_list.value.extend(rng.random(8 * n))
                feat["steps/action"].float_list.value.extend(rng.random(7 * n))
                feat["steps/is_first"].int64_list.value.extend([1] + [0] * (n - 1))
                feat["steps/is_last"].int64_list.value.extend([0] * (n - 1) + [1])
                feat["steps/language_instruction"].bytes_list.value.extend([b"pick up the cup"] * n)
                feat["episode_metadata/file_path"].bytes_list.value.append(f"raw/{e}".encode())
                f.write(frame_record(ex.SerializeToString()))
    (folder / "features.json").write_text(json.dumps(_features()))
    info = {"name": "bench_rlds", "fileFormat": "tfrecord", "version": "1.0.0", "moduleName": "bench",
            "splits": [{"name": "train", "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
                        "shardLengths": [str(len(p)) for p in per]}]}  # fmt: skip
    (folder / "dataset_info.json").write_text(json.dumps(info))
    (folder / ".done").write_text("ok\n")
    return folder


def _source_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.tfrecord-*"))


def tfds_only(folder: str) -> None:
    """Time TFDS's reader over ``folder`` (decoded and SkipDecoding); print JSON lines."""
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(folder)
    skip = {"steps": {"observation": {"image": tfds.decode.SkipDecoding(),
                                      "wrist_image": tfds.decode.SkipDecoding()}}}  # fmt: skip
    for label, decoders in (("tfds (images decoded)", None), ("tfds (SkipDecoding)", skip)):
        ds = builder.as_dataset("train", shuffle_files=False, decoders=decoders,
                                read_config=tfds.ReadConfig(interleave_cycle_length=1))  # fmt: skip
        for _ in range(2):  # the first pass warms TF up (graph tracing): the second is timed
            t0 = time.perf_counter()
            episodes = 0
            for episode in ds:
                for _ in tfds.as_numpy(episode["steps"]):
                    pass
                episodes += 1
            seconds = time.perf_counter() - t0
        print(json.dumps({"name": label, "episodes": episodes, "seconds": seconds}))


def _treadle_once(folder: Path, images: str, root: Path, k: int) -> tuple[int, float]:
    import treadle as td

    client = td.Client(str(root), create=True)
    t0 = time.perf_counter()
    res = td.importers.rlds(
        folder, client.project(f"p{k}"), "t", images=images, fps=10, progress=False
    )
    seconds = time.perf_counter() - t0
    assert not res.skipped and res.episodes > 0, res
    return res.episodes, seconds


def _row(name: str, episodes: int, seconds: list[float], nbytes: int) -> dict:
    s = statistics.median(seconds)
    return {"name": name, "episodes_per_s": round(episodes / s, 2), "mb_per_s": round(nbytes / s / 1e6, 2),
            "seconds": [round(x, 3) for x in seconds]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tfds-python", default=None, help="a Python with tensorflow-datasets")
    ap.add_argument("--tfds-only", default=None, metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tfds_only:
        tfds_only(args.tfds_only)
        return
    folder = generate(args.tiny)
    nbytes = _source_bytes(folder)
    times: dict[str, list[float]] = {}
    episodes = {}
    tmp = Path(tempfile.mkdtemp(prefix="treadle-bench-rlds-"))
    projects = iter(range(1 << 30))  # a fresh project each import: a committed id is skipped
    try:
        for _ in range(args.runs):
            for images in ("encoded", "video"):
                n, s = _treadle_once(folder, images, tmp, next(projects))
                times.setdefault(f"treadle {images}", []).append(s)
                episodes[f"treadle {images}"] = n
            if args.tfds_python:
                out = subprocess.run([args.tfds_python, __file__, "--tfds-only", str(folder)],
                                     capture_output=True, text=True, check=True).stdout  # fmt: skip
                for line in out.splitlines():
                    if line.startswith("{"):
                        r = json.loads(line)
                        times.setdefault(r["name"], []).append(r["seconds"])
                        episodes[r["name"]] = r["episodes"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sz = sizes(args.tiny)
    print(f"RLDS import, {sz['episodes']} episodes x {sz['steps']} steps, 2 cameras {SIDE}x{SIDE} JPEG, "
          f"{sz['shards']} shards, {nbytes / 1e6:.1f} MB")  # fmt: skip
    for name, seconds in times.items():
        print(json.dumps(_row(name, episodes[name], seconds, nbytes)))


if __name__ == "__main__":
    main()
