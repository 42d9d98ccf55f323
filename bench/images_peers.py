"""Case ``images``, peer rows: the same encoded images read by WebDataset, HF ``datasets`` and
MosaicML Streaming, each decoding per sample in Python as its users do.

Each peer stores **the same bytes** as the treadle tables (checked when written) and mixes
its three sets at :data:`case_images.WEIGHTS`, batch 64, single frames only:

- WebDataset: one ``TarWriter`` shard per table, ``RandomMix`` of ``.repeat()`` pipelines,
  ``Image.open(...).convert("RGB")`` (and the PNG table's bilinear resize) in a ``map``;
- HF ``datasets``: one ``save_to_disk`` per table with an ``Image()`` feature (``{"bytes":
  ...}`` values are kept as given), ``interleave_datasets`` at the weights
  (``all_exhausted``), decoded by the feature, converted and resized in ``with_transform``,
  a shuffled ``DataLoader``;
- MosaicML Streaming: one ``MDSWriter`` folder per table, columns ``jpeg`` / ``png`` (the
  ``jpeg`` encoding stores a ``JpegImageFile``'s file bytes as they are, so each JPEG is
  handed over as a file; ``png`` re-encodes, and the result is checked equal to ours),
  ``Stream`` proportions at the weights, a shuffled ``StreamingDataset`` in a ``DataLoader``.

All three go through ``torch.utils.data.DataLoader`` at workers 0 and 2 (spawned).
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import case_mix  # noqa: F401  (torchvision op schemas for ``streaming``; HF offline)
from benchlib import Result, Run, batch_len, measure

BATCH = 64
SIZE = (224, 224)
WEIGHTS = {"jpg_a": 0.3, "jpg_b": 0.5, "png": 0.2}
SEED = 44
NEEDS = {"wds": "webdataset", "hf": "datasets", "mds": "streaming"}
LABELS = {
    "wds": "WebDataset RandomMix + PIL",
    "hf": "HF Image() + interleave_datasets",
    "mds": "MosaicML Streaming jpeg/png + Stream proportions",
}


def rgb(img: Any) -> np.ndarray:
    """A PIL image as the batch's frame: RGB, the 640x480 table resized (bilinear)."""
    from PIL import Image

    img = img.convert("RGB")
    if img.size != (SIZE[1], SIZE[0]):
        img = img.resize((SIZE[1], SIZE[0]), Image.BILINEAR)
    return np.asarray(img)


def _values(client: Any, name: str) -> list[bytes]:
    table = client.project("bench").branch().table(name).pin()
    return table.to_arrow(["cam"]).column("cam").to_pylist()


# -- WebDataset -------------------------------------------------------------------------
def write_wds(root: Path, client: Any) -> Path:
    import webdataset as wds

    out = root / "wds"
    if (out / "done").exists():
        return out
    for name in WEIGHTS:
        (out / name).mkdir(parents=True, exist_ok=True)
        ext = "png" if name == "png" else "jpg"
        with wds.TarWriter(str(out / name / "000000.tar")) as w:
            for i, v in enumerate(_values(client, name)):
                w.write({"__key__": f"{i:06d}", ext: v})
    (out / "done").write_text("ok\n")
    return out


def _wds_sample(sample: dict) -> np.ndarray:
    from PIL import Image

    return rgb(Image.open(io.BytesIO(sample.get("jpg") or sample["png"])))


def wds_iter(out: Path, workers: int, samples: int) -> Iterator[Any]:
    import webdataset as wds

    sets = [wds.WebDataset(str(out / n / "000000.tar"), shardshuffle=False, empty_check=False)
            .repeat().map(_wds_sample) for n in WEIGHTS]  # fmt: skip
    mix = wds.RandomMix(sets, probs=list(WEIGHTS.values()))
    return iter(_loader(mix, workers))


# -- Hugging Face datasets --------------------------------------------------------------
def write_hf(root: Path, client: Any) -> Path:
    import datasets

    out = root / "hf"
    if (out / "done").exists():
        return out
    feats = datasets.Features({"image": datasets.Image()})
    for name in WEIGHTS:
        values = _values(client, name)
        rows = {"image": [{"bytes": v, "path": None} for v in values]}
        datasets.Dataset.from_dict(rows, features=feats).save_to_disk(str(out / name))
        kept = datasets.load_from_disk(str(out / name)).cast_column(
            "image", datasets.Image(decode=False)
        )
        if [x["bytes"] for x in kept["image"]] != values:
            raise RuntimeError(f"HF Image() did not keep table {name!r}'s bytes as given")
    (out / "done").write_text("ok\n")
    return out


def _hf_batch(batch: dict[str, list]) -> dict[str, list]:
    return {"image": [rgb(img) for img in batch["image"]]}


def hf_iter(out: Path, workers: int, samples: int) -> Iterator[Any]:
    import datasets

    parts = [datasets.load_from_disk(str(out / n)) for n in WEIGHTS]
    mixed = datasets.interleave_datasets(parts, probabilities=list(WEIGHTS.values()), seed=SEED,
                                         stopping_strategy="all_exhausted")  # fmt: skip
    if len(mixed) < samples:  # tiny tables: the mix repeated
        mixed = datasets.concatenate_datasets([mixed] * -(-samples // len(mixed)))
    mixed = mixed.with_transform(_hf_batch)
    gen = torch.Generator().manual_seed(SEED)
    return iter(_loader(mixed, workers, shuffle=True, generator=gen))


# -- MosaicML Streaming -----------------------------------------------------------------
def write_mds(root: Path, client: Any) -> Path:
    from PIL import Image
    from streaming import MDSWriter
    from streaming.base.format.mds.encodings import PNG

    out = root / "mds"
    if (out / "done").exists():
        return out
    with tempfile.TemporaryDirectory(prefix="treadle-bench-mds-") as tmp:
        one = Path(tmp) / "image.jpg"
        for name in WEIGHTS:
            enc = "png" if name == "png" else "jpeg"
            values = _values(client, name)
            if enc == "png" and PNG().encode(Image.open(io.BytesIO(values[0]))) != values[0]:
                raise RuntimeError("MDS's png encoding would not store the table's PNG bytes")
            with MDSWriter(out=str(out / name), columns={"image": enc}, size_limit="64mb") as w:
                for v in values:
                    if enc == "jpeg":  # stored as the file's bytes, not encoded again
                        one.write_bytes(v)
                        img = Image.open(one)
                    else:
                        img = Image.open(io.BytesIO(v))
                    w.write({"image": img})
    (out / "done").write_text("ok\n")
    return out


class MDSFrames(torch.utils.data.IterableDataset):
    """A ``StreamingDataset``'s images as frames (PIL decode per sample, as users do)."""

    def __init__(self, ds: Any):
        self.ds = ds

    def __iter__(self) -> Iterator[np.ndarray]:
        for s in self.ds:
            yield rgb(s["image"])


def mds_iter(out: Path, workers: int, samples: int) -> Iterator[Any]:
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    streams = [Stream(local=str(out / n), proportion=w) for n, w in WEIGHTS.items()]
    # epoch_size: enough samples for the run whatever the tables' size (2 workers split it)
    ds = StreamingDataset(streams=streams, batch_size=BATCH, shuffle=True, shuffle_seed=SEED,
                          batching_method="random", epoch_size=2 * samples)  # fmt: skip
    return iter(_loader(MDSFrames(ds), workers))


# -- rows -------------------------------------------------------------------------------
def _loader(ds: Any, workers: int, **kw: Any) -> Any:
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=workers,
                                       multiprocessing_context="spawn" if workers else None,
                                       persistent_workers=False, **kw)  # fmt: skip


WRITERS: dict[str, Callable[[Path, Any], Path]] = {"wds": write_wds, "hf": write_hf,
                                                    "mds": write_mds}  # fmt: skip
ITERS: dict[str, Callable[[Path, int, int], Iterator[Any]]] = {"wds": wds_iter, "hf": hf_iter,
                                                          "mds": mds_iter}  # fmt: skip


def rows(root: Path, client: Any, batches: int, warm: int,
         log: Callable[[str], None] = print) -> list[tuple[Result, Callable[[], Run]]]:  # fmt: skip
    """Each peer at workers 0 and 2: ``batches`` timed batches after ``warm`` more than the
    first. A peer that is not installed, or whose data could not be written, says so."""
    out = []
    for name, mod in NEEDS.items():
        status, where = "ok", None
        try:
            __import__(mod)
        except ImportError:
            status = "not installed"
        if status == "ok":
            try:
                where = WRITERS[name](root, client)
            except Exception as e:  # reported in its rows, the others go on
                status = f"failed: {type(e).__name__}: {str(e)[:160]}"
                log(f"  images: {name} data: {status}")
        for workers in (0, 2):
            cfg = {"window": "single", "batch": BATCH, "workers": workers, "threads": 1,
                   "where": "local"}  # fmt: skip
            r = Result("images", name, cfg, "frames/s", status=status)
            r.config["label"] = f"{LABELS[name]}, DataLoader workers={workers}"

            def fn(name=name, where=where, workers=workers) -> Run:
                need = (batches + warm + 2) * BATCH
                make = lambda: ITERS[name](where, workers, need)  # noqa: E731
                return measure(make, batches * BATCH, batch_len, warm)

            out.append((r, fn))
    return out
