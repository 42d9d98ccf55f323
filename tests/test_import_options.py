"""What every importer shares: one set of options, and tensor columns written one way."""

from __future__ import annotations

import dataclasses
import inspect
import json

import numpy as np
import pyarrow as pa
import pytest

import treadle.importers as ti
from importer_fixtures import make_hf, make_lerobot_v21, make_mds, make_wds, nothing_committed
from treadle.catalog import Client
from treadle.errors import NotFound
from treadle.importers.run import ImportOptions
from treadle.table.tensors import tensor_field, to_numpy

IMPORTERS = {"webdataset": ti.webdataset, "mds": ti.mds, "hf": ti.hf, "lerobot": ti.lerobot}
#: the keyword arguments all four importers take
SHARED = {
    "branch",
    "images",
    "allow_pickle",
    "storage_options",
    "source_options",
    "client",
    "root",
    "progress",
    "rename",
    "executor",
}


@pytest.fixture
def client(local_root):
    return Client(local_root)


@pytest.mark.parametrize("fmt", sorted(IMPORTERS))
def test_importers_take_the_shared_options_as_keywords(fmt):
    params = inspect.signature(IMPORTERS[fmt]).parameters
    defaults = {f.name: f.default for f in dataclasses.fields(ImportOptions)}
    assert SHARED <= set(params), SHARED - set(params)
    for name, p in params.items():
        if name in defaults:  # an option ImportOptions holds: keyword-only, same default
            assert p.kind is inspect.Parameter.KEYWORD_ONLY, name
            assert p.default == defaults[name], (fmt, name, p.default, defaults[name])


def test_options_come_from_an_importers_arguments_and_hide_credentials():
    opts = ImportOptions.of(
        {"images": "decoded", "storage_options": {"secret": "s3cr3t"}, "split": "train"}
    )
    assert opts.images == "decoded" and opts.storage_options == {"secret": "s3cr3t"}
    assert "s3cr3t" not in repr(opts) and "s3cr3t" not in repr(opts.for_sources())
    assert opts.for_sources().storage_options is None
    with pytest.raises(ValueError, match="images must be"):
        ImportOptions(images="png")
    with pytest.raises(ValueError, match="json_as must be"):
        ImportOptions(json_as="yaml")


def test_lerobot_refuses_an_unknown_images_option(tmp_path, client):
    # before: LeRobot alone took images="png" silently (as "encoded")
    make_lerobot_v21(tmp_path / "ds", lengths=(4,))
    with pytest.raises(ValueError, match="images must be 'encoded' or 'decoded'"):
        ti.lerobot(str(tmp_path / "ds"), client.project("p"), "t", images="png", progress=False)


def _source(fmt, folder):
    if fmt == "webdataset":
        return make_wds(folder, n=6, per_shard=3)
    if fmt == "mds":
        return make_mds(folder, n=6, compression=None)
    if fmt == "hf":
        return make_hf(folder, n=6)
    make_lerobot_v21(folder, lengths=(4,))
    return str(folder)


#: a column each fixture's source has (the error lists the source's columns)
A_COLUMN = {"webdataset": "npy", "mds": "label", "hf": "label", "lerobot": "action"}


@pytest.mark.parametrize("fmt", sorted(IMPORTERS))
def test_a_rename_of_a_column_the_source_lacks_is_refused(tmp_path, client, fmt):
    # before: ignored silently (a commit, rows imported), and as the rename is part of the
    # import id, the same files re-imported without it appended the rows a second time
    src = _source(fmt, tmp_path / fmt)
    with pytest.raises(NotFound, match=rf"\['nope'\].*{A_COLUMN[fmt]}"):
        IMPORTERS[fmt](src, client.project("p"), "t", rename={"nope": "y"}, progress=False)
    assert nothing_committed(client.project("p"))


def test_cli_rename_of_a_missing_column_fails(tmp_path, local_root, capsys):
    from treadle.cli import main

    src = make_wds(tmp_path / "w", n=4, per_shard=2)
    args = ["import", "webdataset", src, "--project", "p", "--table", "t", "--root", local_root]
    assert main([*args, "--rename", "nope=y"]) != 0
    assert "'nope'" in capsys.readouterr().err
    assert nothing_committed(Client(local_root).project("p"))


def test_tensor_columns_are_written_as_table_tensors_writes_them(tmp_path, client):
    # before: importers added a "treadle:dtype" key that td's own appends never write
    pattern = make_wds(tmp_path / "wds", n=6, per_shard=3)
    ti.webdataset(pattern, client.project("p"), "w", images="decoded", progress=False)
    schema = client.project("p").branch("main").table("w").schema
    assert schema.field("png").metadata == tensor_field("png", np.uint8, (16, 16, 3)).metadata
    assert schema.field("npy").metadata == tensor_field("npy", np.float32, (7,)).metadata
    folder = make_hf(tmp_path / "hf", n=6)
    ti.hf(folder, client.project("p"), "h", images="decoded", progress=False)
    field = client.project("p").branch("main").table("h").schema.field("image")
    assert field.metadata == tensor_field("image", np.uint8, (8, 8, 3)).metadata


def test_tables_written_with_the_old_dtype_key_still_read_and_take_imports(tmp_path, client):
    """Tensor fields that earlier importers wrote carry ``treadle:dtype`` too: they read
    as before, and a new import appends to them (the table keeps its schema)."""
    pattern = make_wds(tmp_path / "wds", n=6, per_shard=3)
    ti.webdataset(pattern, client.project("p"), "new", images="decoded", progress=False)
    new = client.project("p").branch("main").table("new").pin().to_arrow()
    old_fields = [
        f.with_metadata({**f.metadata, b"treadle:dtype": b"uint8"}) if f.name == "png" else f
        for f in new.schema
    ]
    old = pa.Table.from_arrays(new.columns, schema=pa.schema(old_fields))
    branch = client.project("p").branch("main")
    branch.table("old").append(old, message="written the old way")
    ti.webdataset(pattern, client.project("p"), "old", images="decoded", progress=False)
    t = client.project("p").branch("main").table("old").pin()
    assert t.schema.field("png").metadata[b"treadle:dtype"] == b"uint8"
    assert json.loads(t.schema.field("png").metadata[b"treadle:shape"]) == [16, 16, 3]
    imgs = to_numpy(t.to_arrow(["png"]).column("png"), t.schema.field("png"))
    want = to_numpy(new.column("png"), new.schema.field("png"))
    assert imgs.shape == (12, 16, 16, 3)
    np.testing.assert_array_equal(imgs, np.concatenate([want, want]))
