"""Case 1: image + action, 30/70 mix of two tables, batch 64.

Every sample is a 64x64x3 uint8 image and a float32[7] action. Two tables ("fails" 30 %,
"nominal" 70 %) are written once per format, with that library's own writer, under
``bench/data/mix-<n>/``:

- treadle: two tables of one project, read by ``td.TrainLoader`` (workers 0 and 2);
- MosaicML Streaming: two MDS directories, two ``Stream``s with proportions 0.3/0.7,
  ``batching_method="stratified"``, fixed-shape ``ndarray:uint8:64,64,3`` columns;
- WebDataset: tar shards (raw bytes members, decoded with ``np.frombuffer``), ``RandomMix``;
- Hugging Face datasets: ``save_to_disk`` with ``Array3D`` features, ``interleave_datasets``
  with probabilities, ``with_format("numpy")``, a shuffling DataLoader (batched ``__getitems__``);
- Lance's own torch reader (``lance.torch.data.LanceDataset``) on the treadle table's Lance
  dataset: one table, a sequential scan, no mix and no shuffle, so an upper bound for it;
- the limit: the same bytes in ``.npy`` files in the page cache, random rows gathered with
  numpy fancy indexing (one core, no decode, no framework).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
TABLES = ("fails", "nominal")
WEIGHTS = (0.3, 0.7)
BATCH = 64
SHAPE = (64, 64, 3)
ACTION = 7


def _tv_workaround() -> None:
    """``import torchvision`` (and so ``streaming``) on CPU torch with PyPI's CUDA torchvision.

    Defines the two op schemas torchvision registers first; bench-only, as in the tests.
    """
    if getattr(_tv_workaround, "lib", None) is not None:
        return
    try:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _tv_workaround.lib = lib
    except RuntimeError:
        _tv_workaround.lib = True


_tv_workaround()  # a spawned worker unpickling MDSWrap imports this module first
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# -- data -----------------------------------------------------------------------------------
def _samples(table: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(TABLES.index(table))
    images = rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8)
    actions = rng.standard_normal((n, ACTION), dtype=np.float32)
    return images, actions


def data_dir(n: int) -> Path:
    return Path(os.environ.get("TREADLE_BENCH_DATA") or HERE / "data") / f"mix-{n}"


def generate(n: int, log: Callable[[str], None] = print) -> Path:
    """Write the two tables in every format (once; a ``.done`` marker per format)."""
    root = data_dir(n)
    root.mkdir(parents=True, exist_ok=True)
    writers = {
        "numpy": _write_numpy,
        "treadle": _write_treadle,
        "mds": _write_mds,
        "wds": _write_wds,
        "hf": _write_hf,
    }
    for fmt, write in writers.items():
        done = root / f"{fmt}.done"
        if done.exists():
            continue
        shutil.rmtree(root / fmt, ignore_errors=True)
        log(f"  generating {fmt} ({n:,} samples per table)")
        try:
            write(root / fmt, n)
        except ImportError as e:
            log(f"  {fmt}: not installed ({e})")
            continue
        done.write_text("ok\n")
    return root


def _write_numpy(out: Path, n: int) -> None:
    out.mkdir(parents=True)
    for t in TABLES:
        images, actions = _samples(t, n)
        np.save(out / f"{t}_image.npy", images)
        np.save(out / f"{t}_action.npy", actions)


def _write_treadle(out: Path, n: int) -> None:
    import treadle as td

    branch = td.Client(str(out), create=True).project("bench").branch()
    for t in TABLES:
        images, actions = _samples(t, n)
        branch.table(t).append({"image": images, "action": actions}, message=f"bench {t}")


def _write_mds(out: Path, n: int) -> None:
    from streaming import MDSWriter

    cols = {"image": "ndarray:uint8:64,64,3", "action": "ndarray:float32:7"}
    for t in TABLES:
        images, actions = _samples(t, n)
        with MDSWriter(out=str(out / t), columns=cols, size_limit="64mb") as w:
            for i in range(n):
                w.write({"image": images[i], "action": actions[i]})


def _write_wds(out: Path, n: int) -> None:
    import webdataset as wds

    per = max(1, n // 10)
    for t in TABLES:
        images, actions = _samples(t, n)
        (out / t).mkdir(parents=True)
        with wds.ShardWriter(str(out / t / "%05d.tar"), maxcount=per, verbose=0) as w:
            for i in range(n):
                w.write(
                    {
                        "__key__": f"{i:08d}",
                        "image.u8": images[i].tobytes(),
                        "action.f32": actions[i].tobytes(),
                    }
                )


def _write_hf(out: Path, n: int) -> None:
    import datasets

    feats = datasets.Features(
        {
            "image": datasets.Array3D(shape=SHAPE, dtype="uint8"),
            "action": datasets.Sequence(datasets.Value("float32"), length=ACTION),
        }
    )
    for t in TABLES:
        images, actions = _samples(t, n)

        def gen(images=images, actions=actions):
            for s in range(0, len(images), 1000):
                yield {"image": images[s : s + 1000], "action": actions[s : s + 1000]}

        parts = [
            datasets.Dataset.from_dict(b, features=feats) for b in gen()
        ]  # chunked: from_dict of the whole table holds every row as Python lists
        datasets.concatenate_datasets(parts).save_to_disk(str(out / t))


# -- readers: each returns a fresh iterator of batches ------------------------------------
def treadle_client(root: Path, s3: Any = None, prefix: str = "") -> Any:
    """The treadle client of the case's tables: local, or the copy on S3 under ``prefix``."""
    import treadle as td

    if s3 is None:
        return td.Client(str(root / "treadle"))
    return td.Client(s3.url(prefix), storage_options=s3.storage_options())


def treadle_iter(
    root: Path, workers: int, steps: int, s3: Any = None, prefix: str = ""
) -> Iterator[Any]:
    import treadle as td

    branch = treadle_client(root, s3, prefix).project("bench").branch()
    recipe = td.Recipe(
        seed=2048,
        batch_size=BATCH,
        components=[td.Component(branch.table(t), None, weight=w) for t, w in zip(TABLES, WEIGHTS)],
    )
    prefetch = 4 if workers == 0 else 2
    return iter(td.TrainLoader(recipe, steps=steps, workers=workers, prefetch=prefetch))


def mds_iter(root: Path, workers: int, steps: int) -> Iterator[Any]:
    import torch
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    streams = [Stream(local=str(root / "mds" / t), proportion=w) for t, w in zip(TABLES, WEIGHTS)]
    ds = StreamingDataset(
        streams=streams,
        batch_size=BATCH,
        shuffle=True,
        shuffle_seed=2048,
        batching_method="stratified",
    )
    dl = torch.utils.data.DataLoader(
        MDSDataset(ds),
        batch_size=BATCH,
        num_workers=workers,
        multiprocessing_context="spawn" if workers else None,
        persistent_workers=False,
    )
    return iter(dl)


def _decode_wds(sample: dict) -> dict:
    return {
        "image": np.frombuffer(sample["image.u8"], np.uint8).reshape(SHAPE),
        "action": np.frombuffer(sample["action.f32"], np.float32),
    }


def wds_iter(root: Path, workers: int, steps: int) -> Iterator[Any]:
    import torch
    import webdataset as wds

    sets = []
    for i, t in enumerate(TABLES):
        shards = sorted(str(p) for p in (root / "wds" / t).glob("*.tar"))
        ds = (
            wds.WebDataset(shards, shardshuffle=len(shards), seed=2048 + i, empty_check=False)
            .shuffle(1000)
            .map(_decode_wds)
        )
        sets.append(ds)
    mix = wds.RandomMix(sets, probs=list(WEIGHTS))
    dl = torch.utils.data.DataLoader(
        mix,
        batch_size=BATCH,
        num_workers=workers,
        multiprocessing_context="spawn" if workers else None,
    )
    return iter(dl)


def hf_iter(root: Path, workers: int, steps: int) -> Iterator[Any]:
    import datasets
    import torch

    parts = [datasets.load_from_disk(str(root / "hf" / t)) for t in TABLES]
    mixed = datasets.interleave_datasets(parts, probabilities=list(WEIGHTS), seed=2048)
    mixed = mixed.with_format("numpy")
    dl = torch.utils.data.DataLoader(
        mixed,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context="spawn" if workers else None,
        generator=torch.Generator().manual_seed(2048),
    )
    return iter(dl)


def lance_iter(root: Path, workers: int, steps: int) -> Iterator[Any]:
    import torch
    from lance.torch.data import LanceDataset

    uri = next((root / "treadle" / "projects" / "bench" / "tables").glob("nominal.lance"))
    ds = LanceDataset(str(uri), batch_size=BATCH, columns=["image", "action"])
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="spawn" if workers else None,
    )
    return iter(dl)


def limit_iter(root: Path, workers: int, steps: int) -> Iterator[Any]:
    """Random rows of the same bytes, gathered with numpy from memory-mapped ``.npy`` files."""
    arrays = [
        (
            np.load(root / "numpy" / f"{t}_image.npy", mmap_mode="r"),
            np.load(root / "numpy" / f"{t}_action.npy", mmap_mode="r"),
        )
        for t in TABLES
    ]
    for img, _ in arrays:  # warm the page cache the way the other readers find it
        _ = np.asarray(img[:: max(1, len(img) // 64)]).sum()
    rng = np.random.default_rng(2048)
    counts = [19, 45]  # 30/70 of 64: 19.2 -> 19 or 20; the mix costs the same either way

    def gen() -> Iterator[dict[str, np.ndarray]]:
        while True:
            out_i = np.empty((BATCH, *SHAPE), np.uint8)
            out_a = np.empty((BATCH, ACTION), np.float32)
            at = 0
            for (img, act), k in zip(arrays, counts):
                idx = np.sort(rng.integers(0, len(img), k))
                out_i[at : at + k] = img[idx]
                out_a[at : at + k] = act[idx]
                at += k
            yield {"image": out_i, "action": out_a}

    return gen()


READERS: dict[str, Callable[..., Iterator[Any]]] = {
    "treadle": treadle_iter,
    "mds": mds_iter,
    "wds": wds_iter,
    "hf": hf_iter,
    "lance": lance_iter,
    "limit": limit_iter,
}
LABELS = {
    "treadle": "treadle TrainLoader",
    "mds": "MosaicML Streaming (2 Streams, stratified)",
    "wds": "WebDataset RandomMix",
    "hf": "HF interleave_datasets",
    "lance": "lance.torch LanceDataset (1 table, scan, no mix)",
    "limit": "limit: numpy gather from page cache",
}
NEEDS = {"mds": "streaming", "wds": "webdataset", "hf": "datasets", "lance": "lance"}
DONE_MARK = {"treadle": "treadle", "mds": "mds", "wds": "wds", "hf": "hf", "lance": "treadle"}


def available(name: str, root: Path) -> str:
    """'' when this reader can run, else why not."""
    mod = NEEDS.get(name)
    if mod:
        try:
            __import__(mod)
        except ImportError:
            return "not installed"
    mark = DONE_MARK.get(name, "numpy")
    if not (root / f"{mark}.done").exists():
        return "not installed"
    return ""


class MDSDataset(torch.utils.data.IterableDataset):
    """A StreamingDataset's samples as dicts of arrays (keeps only the two columns)."""

    def __init__(self, ds: Any):
        self.ds = ds

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for s in self.ds:
            yield {"image": s["image"], "action": s["action"]}


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run through bench/suite.py or `treadle bench`")
