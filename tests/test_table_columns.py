"""Fixed-size list columns written without treadle's metadata are tensors, not dropped.

The columns come from other writers: plain pyarrow ``fixed_size_list`` (flat and nested),
Arrow's ``fixed_shape_tensor``, and Hugging Face ``Sequence(length=7)`` / ``Array2D`` as
``datasets`` builds them in Arrow. Every one must read back exactly, with its shape,
through ``TrainLoader`` (with and without windows) and ``ScanDataset``. A column a batch
cannot hold (structs; strings, bytes and variable-length lists arrive as Python lists) is
refused by name at plan time.
"""

from __future__ import annotations

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch

import treadle as td
from treadle.errors import CorruptData, PlanError

N = 6  # rows: episodes "a" (frames 0..2) and "b" (frames 0..2)
RNG = np.random.default_rng(7)
SEQ = RNG.standard_normal((N, 7)).astype(np.float32)
NESTED = RNG.integers(-300, 300, (N, 2, 3)).astype(np.int16)
TENSOR = RNG.standard_normal((N, 4, 2)).astype(np.float64)
HF_SEQ = RNG.standard_normal((N, 7)).astype(np.float32)
HF_ARR = RNG.standard_normal((N, 2, 3)).astype(np.float32)
EXPECTED = {"seq": SEQ, "nested": NESTED, "tensor": TENSOR, "hf_seq": HF_SEQ, "hf_arr": HF_ARR}


def _fsl(values: np.ndarray) -> pa.Array:
    """Nested fixed-size lists, one level per dimension, built by pyarrow alone."""
    arr: pa.Array = pa.array(values.reshape(-1))
    for size in reversed(values.shape[1:]):
        arr = pa.FixedSizeListArray.from_arrays(arr, size)
    return arr


def _source_table() -> pa.Table:
    features = datasets.Features(
        {
            "hf_seq": datasets.Sequence(datasets.Value("float32"), length=7),
            "hf_arr": datasets.Array2D((2, 3), "float32"),
        }
    )
    hf = datasets.Dataset.from_dict(
        {"hf_seq": HF_SEQ.tolist(), "hf_arr": HF_ARR.tolist()}, features=features
    ).data.table
    assert pa.types.is_fixed_size_list(hf.schema.field("hf_seq").type)
    assert isinstance(hf.schema.field("hf_arr").type, pa.ExtensionType)
    return pa.table(
        {
            "episode": pa.array(["a"] * 3 + ["b"] * 3),
            "frame": pa.array([0, 1, 2] * 2, pa.int32()),
            "seq": pa.FixedSizeListArray.from_arrays(pa.array(SEQ.reshape(-1)), 7),
            "nested": _fsl(NESTED),
            "tensor": pa.FixedShapeTensorArray.from_numpy_ndarray(TENSOR),
            "hf_seq": hf.column("hf_seq"),
            "hf_arr": hf.column("hf_arr"),
        }
    )


@pytest.fixture
def plain(local_root):
    branch = td.Client(local_root).project("p").branch("main")
    branch.table("plain").append(_source_table())
    return branch


def _by_moment(batch):
    order = np.argsort(batch["_moment"].numpy())
    return {k: v.numpy()[order] for k, v in batch.items()}, np.sort(batch["_moment"].numpy())


def test_train_loader_without_windows_reads_every_tensor(plain):
    recipe = td.Recipe(seed=1, batch_size=N, components=[td.Component(plain.table("plain"))])
    batch = next(iter(td.TrainLoader(recipe)))
    assert sorted(batch) == sorted([*EXPECTED, "_component", "_moment", "_episode", "_frame"])
    got, moments = _by_moment(batch)
    assert moments.tolist() == list(range(N))
    for col, want in EXPECTED.items():
        assert got[col].dtype == want.dtype, col
        np.testing.assert_array_equal(got[col], want, err_msg=col)


def test_train_loader_with_windows_reads_every_tensor(plain):
    windows = td.Windows({col: td.Rows([0, 1]) for col in EXPECTED})
    recipe = td.Recipe(
        seed=1, batch_size=4, components=[td.Component(plain.table("plain"), windows)]
    )
    batch = next(iter(td.TrainLoader(recipe)))
    got, moments = _by_moment(batch)
    assert moments.tolist() == [0, 1, 3, 4]  # the last frame of each episode has no next
    rows = moments[:, None] + np.array([0, 1])
    for col, want in EXPECTED.items():
        assert got[col].shape == (4, 2, *want.shape[1:]), col
        np.testing.assert_array_equal(got[col], want[rows], err_msg=col)


def test_scan_dataset_reads_every_tensor(plain):
    scan = plain.table("plain").scan_request(list(EXPECTED))
    batches = list(td.ScanDataset(scan, batch_size=4))
    for col, want in EXPECTED.items():
        got = torch.cat([b[col] for b in batches]).numpy()
        assert got.shape == want.shape, col
        np.testing.assert_array_equal(got, want, err_msg=col)


@pytest.mark.parametrize(
    "column, values",
    [
        ("pose", pa.array([{"x": 1.0, "y": 2.0}] * N)),
        # binary columns arrive as list[bytes] (tests/test_image_columns.py)
    ],
)
def test_columns_a_batch_cannot_hold_are_refused_by_name(local_root, column, values):
    branch = td.Client(local_root).project("p").branch("main")
    base = _source_table().select(["episode", "frame", "seq"])
    branch.table("t").append(base.append_column(column, values))
    ref = branch.table("t")

    def plan(windows):
        td.Recipe(seed=0, batch_size=2, components=[td.Component(ref, windows)]).plan()

    # without windows every column is read: this one would silently vanish, so refuse it
    for windows in (None, td.Windows({})):
        with pytest.raises(PlanError, match=rf"column '{column}' of table 't'"):
            plan(windows)
    with pytest.raises(PlanError, match=rf"column '{column}' of table 't'"):
        plan(td.Windows({column: td.Rows([0])}))
    with pytest.raises(PlanError, match=rf"column '{column}' of table 't'"):
        td.ScanDataset(ref.scan_request(["seq", column]), batch_size=2)
    # not asked for: the rest reads as usual
    recipe = td.Recipe(
        seed=0, batch_size=2, components=[td.Component(ref, td.Windows({"seq": td.Rows([0])}))]
    )
    got, moments = _by_moment(next(iter(td.TrainLoader(recipe))))
    np.testing.assert_array_equal(got["seq"][:, 0], SEQ[moments])


def test_null_scalars_are_refused_not_read_as_nan(local_root):
    branch = td.Client(local_root).project("p").branch("main")
    branch.table("t").append({"n": pa.array([1, None, 3], pa.int64())})
    recipe = td.Recipe(seed=0, batch_size=3, components=[td.Component(branch.table("t"))])
    # the write recorded the null (table/null_columns.py): the plan refuses it, before step 0
    with pytest.raises(td.PlanError, match=r"column 'n' of table 't' is null at episode"):
        next(iter(td.TrainLoader(recipe)))


def test_null_scalars_of_a_table_with_no_record_are_refused_when_read(local_root, monkeypatch):
    """A table written before writes recorded their nulls: the read still refuses them."""
    import treadle.table.write as write

    monkeypatch.setattr(write, "with_nulls", lambda schema, rows: schema)
    branch = td.Client(local_root).project("p").branch("main")
    branch.table("t").append({"n": pa.array([1, None, 3], pa.int64())})
    recipe = td.Recipe(seed=0, batch_size=3, components=[td.Component(branch.table("t"))])
    with pytest.raises(CorruptData, match=r"table 't'.*column 'n'.*null"):
        next(iter(td.TrainLoader(recipe)))


def test_a_tensor_of_no_values_per_moment_is_named(tmp_path):
    # was pyarrow's "list_size needs to be a strict positive integer", naming nothing
    table = td.Client(str(tmp_path)).project("p").branch("main").table("t")
    with pytest.raises(td.errors.SchemaMismatch, match=r"column 'a' has shape \[2, 0\] per moment"):
        table.append_episode({"a": np.zeros((3, 2, 0), np.float32)}, episode="e")
    assert td.Client(str(tmp_path)).project("p").branch("main").tables() == []
