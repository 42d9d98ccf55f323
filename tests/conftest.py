"""Shared fixtures: a fresh local root per test and one SeaweedFS S3 server per session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server (SeaweedFS ``weed mini``) on 127.0.0.1 for the whole session."""
    from treadle.testing import SeaweedS3

    server = SeaweedS3(bucket="treadle").start()
    yield server
    server.stop()


@pytest.fixture
def s3_root(s3_server, request):
    """A fresh ``s3://`` root prefix per test, with its storage options."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:60]
    return s3_server.url(f"t-{os.getpid()}-{name}-{id(request)}"), s3_server.storage_options()


@pytest.fixture
def local_root(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    return str(root)


@pytest.fixture(params=["local", "s3"])
def any_root(request, tmp_path):
    """Runs a test once on local disk and once on the S3 server."""
    if request.param == "local":
        root = tmp_path / "store"
        root.mkdir()
        return str(root), None
    server = request.getfixturevalue("s3_server")
    name = request.node.name.replace("[", "-").replace("]", "")[:50]
    return server.url(f"t-{os.getpid()}-{name}-{id(request)}"), server.storage_options()
