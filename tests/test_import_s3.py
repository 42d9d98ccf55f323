"""Imports read their sources from an object store (SeaweedFS S3 on 127.0.0.1) and write to S3."""

from __future__ import annotations

from pathlib import Path

import pytest

from importer_fixtures import make_hf, make_lerobot_v21, make_mds
from treadle.catalog import Client
from treadle.importers import hf as import_hf
from treadle.importers import lerobot as import_lerobot
from treadle.importers import mds as import_mds
from treadle.storage import Store

pytestmark = pytest.mark.s3


def _upload(folder: Path, url: str, opts: dict) -> None:
    store = Store.open(url, opts)
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            store.put(str(p.relative_to(folder)), p.read_bytes())


@pytest.mark.parametrize("fmt", ["mds", "hf", "lerobot"])
def test_import_from_and_into_s3(tmp_path, s3_server, s3_root, fmt):
    opts = s3_server.storage_options()
    src_url = s3_server.url(f"src-{fmt}-{tmp_path.name}")
    folder = tmp_path / "src"
    if fmt == "mds":
        make_mds(folder, n=30, compression="zstd", size_limit=1 << 13)
        fn, want = import_mds, 30
    elif fmt == "hf":
        make_hf(folder, n=20)
        fn, want = import_hf, 20
    else:
        make_lerobot_v21(folder, lengths=(5, 4))
        fn, want = import_lerobot, 9
    _upload(folder, src_url, opts)
    root, root_opts = s3_root
    client = Client(root, root_opts)
    res = fn(src_url, client.project("p"), "t", source_options=opts, progress=False)
    assert res.rows == want
    assert client.project("p").branch("main").table("t").num_moments == want
