"""Shared fixtures: a fresh local root per test, one SeaweedFS S3 server and one Azurite
Azure Blob emulator per session."""

from __future__ import annotations

import faulthandler
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Hugging Face's caches in a folder of the session, set before anything imports datasets or
# lerobot (they read these at import): LeRobotDataset wrote ~/.cache/huggingface/datasets
HF_HOME = tempfile.mkdtemp(prefix="treadle-tests-hf-")
os.environ["HF_HOME"] = HF_HOME
os.environ["HF_DATASETS_CACHE"] = os.path.join(HF_HOME, "datasets")
os.environ["HF_LEROBOT_HOME"] = os.path.join(HF_HOME, "lerobot")
# torch's compile cache too, inherited by the processes tests start: it was
# /tmp/torchinductor_<user> (made when torchvision, Lightning or torch.compile first asks)
INDUCTOR = tempfile.mkdtemp(prefix="treadle-tests-inductor-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = INDUCTOR


@pytest.fixture(scope="session", autouse=True)
def _object_cache(tmp_path_factory):
    """The object cache of object-store reads (treadle.storage.filecache) in a folder of the
    session, not the user's ~/.cache; it keeps 256 MiB of the disk free, not the default 5%
    of it (the tests copy a few MiB: a large disk nearly full, as a shared CI machine's may
    be, would otherwise turn every cached read of the suite into Lance takes)."""
    from treadle.storage import filecache

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TREADLE_CACHE_DIR", str(tmp_path_factory.mktemp("object-cache")))
        mp.setenv("TREADLE_CACHE_MIN_FREE", "256M")  # worker processes: the environment
        mp.setattr(filecache, "MIN_FREE_BYTES", 256 << 20)  # caches a test makes itself
        mp.setattr(filecache, "MIN_FREE_SHARE", 0.0)
        yield


@pytest.fixture(scope="session", autouse=True)
def _ray_token():
    """Ray's token for the local clusters the tests start (``ray.init()``), in the
    environment: without one, Ray writes a new one to ``~/.ray/auth_token`` and reads it
    back, and two test processes starting Ray at once on a fresh machine race on that file."""
    import secrets

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
        yield


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


@pytest.fixture(params=["local", "s3", "az"])
def any_root(request, tmp_path):
    """Runs a test on local disk, on the S3 server and on the Azure emulator."""
    if request.param == "local":
        root = tmp_path / "store"
        root.mkdir()
        return str(root), None
    if request.param == "az":
        return request.getfixturevalue("az_root")
    server = request.getfixturevalue("s3_server")
    name = request.node.name.replace("[", "-").replace("]", "")[:50]
    return server.url(f"t-{os.getpid()}-{name}-{id(request)}"), server.storage_options()


@pytest.fixture(scope="module", autouse=True)
def _streaming_leftovers():
    """After each module, the shared memory and /tmp file locks of the MosaicML
    ``StreamingDataset`` objects it made (each left ``/tmp/<prefix>_cache_filelock``)."""
    yield
    fixtures = sys.modules.get("importer_fixtures")
    if fixtures is not None and fixtures.STREAMING_PREFIXES:
        fixtures.clean_streaming()


#: After this long every process of the suite prints every thread's stack, and again each
#: time as long again (a run takes ~15 min): each test has pytest-timeout's bound, but
#: xdist's controller, which runs no test, had none, and a stalled CI run said nothing
#: for 90 minutes
SUITE_STACKS_AFTER_S = float(os.environ.get("TREADLE_SUITE_STACKS_AFTER_S", 2700))


def pytest_configure(config):
    config.addinivalue_line("markers", "azure: talks to the Azurite Azure Blob emulator")
    faulthandler.dump_traceback_later(SUITE_STACKS_AFTER_S, repeat=True)


def pytest_unconfigure(config):
    faulthandler.cancel_dump_traceback_later()
    shutil.rmtree(HF_HOME, ignore_errors=True)
    shutil.rmtree(INDUCTOR, ignore_errors=True)


_AZURITE = Path(__file__).parent / "azurite" / "node_modules" / ".bin" / "azurite-blob"


@pytest.fixture(scope="session")
def az_server():
    """The Azure Blob emulator (Azurite, ``tests/azurite``) on 127.0.0.1 for the session.

    Skipped when Azurite is not installed, except under ``CI=true``, where that fails.
    """
    from treadle.testing import Azurite, azurite_binary

    try:
        binary = azurite_binary([_AZURITE])
    except RuntimeError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {e}")
        pytest.skip(str(e))
    server = Azurite(binary).start()
    yield server
    server.stop()


@pytest.fixture
def az_root(az_server, request):
    """A fresh ``az://`` root (a new container) per test, with its storage options."""
    return az_server.url(az_server.new_container(request.node.name)), az_server.storage_options()


@pytest.fixture
def no_etags(monkeypatch):
    """Every ranged read's answer carries no ETag, as a store that gives none."""
    from treadle.storage import ranged

    real = ranged.obstore.get_async

    async def no_etag(*args, **kwargs):
        got = await real(*args, **kwargs)

        class Result:
            meta = dict(got.meta, e_tag=None)

            async def bytes_async(self):
                return await got.bytes_async()

        return Result()

    monkeypatch.setattr(ranged.obstore, "get_async", no_etag)


@pytest.fixture(params=["compiled", "python"])
def native_loop(request, monkeypatch):
    """Run the test with the native loop's FFmpeg calls made by the compiled window loop
    (:mod:`treadle.video.window_loop`, the default), then made from Python (where the
    extension is not built); at the end, checks that the other one never ran."""
    from treadle import fastpaths
    from treadle.video import native, window_loop

    if request.param == "python":
        monkeypatch.setattr(
            window_loop, "CHECKED", fastpaths.Checked.fixed("compiled window loop", None)
        )
    else:
        assert window_loop.load() is not None, window_loop.unavailable()
    ran = {"compiled": 0, "python": 0}

    def counted(kind, real):
        def call(*a, **k):
            ran[kind] += 1
            return real(*a, **k)

        return call

    monkeypatch.setattr(
        native.NativeLoop, "_run_compiled", counted("compiled", native.NativeLoop._run_compiled)
    )
    monkeypatch.setattr(
        native.NativeLoop, "_receive", counted("python", native.NativeLoop._receive)
    )
    yield request.param
    assert ran["python" if request.param == "compiled" else "compiled"] == 0, ran
