"""Imports read their sources from an object store (SeaweedFS S3 on 127.0.0.1) and write to S3."""

from __future__ import annotations

from pathlib import Path

import pytest

from importer_fixtures import make_hf, make_lerobot_v21, make_mds, make_wds
from treadle.catalog import Client
from treadle.errors import NotFound
from treadle.importers import hf as import_hf
from treadle.importers import lerobot as import_lerobot
from treadle.importers import mds as import_mds
from treadle.importers import webdataset as import_wds
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


def test_webdataset_import_of_an_s3_prefix_reads_every_shard_under_it(tmp_path, s3_server, s3_root):
    # before: `treadle import webdataset s3://bucket/shards/` (as docs/cli.md shows it) read
    # the prefix as one shard named "shards" and said "no WebDataset shard s3://.../shards"
    opts = s3_server.storage_options()
    src_url = s3_server.url(f"wds-{tmp_path.name}")
    make_wds(tmp_path / "src", n=60, per_shard=25)
    _upload(tmp_path / "src", src_url, opts)
    root, root_opts = s3_root
    project = Client(root, root_opts).project("p")
    res = import_wds(src_url + "/", project, "t", source_options=opts, progress=False)
    assert res.rows == 60
    keys = project.branch("main").table("t").to_arrow(["key"]).column("key").to_pylist()
    assert keys == [f"sample{i:05d}" for i in range(60)]
    # without the '/', the prefix is read as one shard: the error says how to name the prefix
    with pytest.raises(NotFound, match=r"end it with '/': s3://.*/wds-"):
        import_wds(src_url, project, "t2", source_options=opts, progress=False)
    with pytest.raises(NotFound, match=r"no \.tar shards under .*empty/"):
        import_wds(s3_server.url("empty") + "/", project, "u", source_options=opts, progress=False)


def _flags(flag: str, opts: dict) -> list[str]:
    return [arg for k, v in opts.items() for arg in (flag, f"{k}={v}")]


def test_credential_errors_name_the_option_of_the_store_they_are_about(
    tmp_path, s3_server, s3_root, capsys, monkeypatch
):
    """treadle import rewrote --storage-option to --source-option in any error after the
    store opened, whichever store it was about, and missed the rest of the text: a source
    refused for its credentials said "check credentials in storage_options" (the store's).
    Each error now names the options of the store it is about, where it is raised."""
    from treadle.cli import main
    from treadle.errors import CredentialsError

    for var in [v for v in __import__("os").environ if v.startswith("AWS_")]:
        monkeypatch.delenv(var)
    opts = s3_server.storage_options()
    wrong = {**opts, "aws_secret_access_key": "not-the-secret"}
    src_url = s3_server.url(f"creds-{tmp_path.name}")
    make_wds(tmp_path / "src", n=10, per_shard=10)
    _upload(tmp_path / "src", src_url, opts)
    shard = f"{src_url}/{sorted(p.name for p in (tmp_path / 'src').iterdir())[0]}"
    local = tmp_path / "store"
    argv = ["import", "webdataset", shard, "--project", "p", "--table", "t", "--no-progress"]
    assert main([*argv, "--root", str(local), *_flags("--source-option", wrong)]) == 1
    err = capsys.readouterr().err
    assert "CredentialsError" in err and "access denied" in err, err
    assert "--source-option" in err and "storage" not in err.replace(str(local), ""), err
    with pytest.raises(CredentialsError, match="source_options") as e:
        import_wds(
            shard, Client(str(local)).project("p"), "t", source_options=wrong, progress=False
        )
    assert "storage" not in str(e.value)
    root, root_opts = s3_root  # the store's credentials are wrong, the source's right
    into = [*_flags("--storage-option", {**root_opts, "aws_secret_access_key": "not-it"})]
    assert main([*argv, "--root", root, *into, *_flags("--source-option", opts)]) == 1
    err = capsys.readouterr().err
    assert "CredentialsError" in err and "access denied" in err, err
    assert "--storage-option" in err and "source" not in err, err
