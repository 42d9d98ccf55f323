"""treadle.testing's servers start when run at once in two test processes: every port of
``weed mini`` is chosen (none left to its fixed defaults), and a launch that exits before it
is ready (a chosen port taken meanwhile) is retried on fresh ports."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from treadle import testing
from treadle.storage import Store
from treadle.testing import SeaweedS3, ServerExitedEarly


def _taken_first(monkeypatch, busy_port: int, times: int) -> list[int]:
    """Make the first ``times`` launches' S3 port ``busy_port``; returns the ports given."""
    real = testing._free_ports
    given: list[int] = []

    def ports(n: int) -> list[int]:
        out = real(n)
        if n > 1 and len(given) < times:
            out[3] = busy_port  # the order of SeaweedS3's names: master, volume, filer, s3
        if n > 1:
            given.append(out[3])
        return out

    monkeypatch.setattr(testing, "_free_ports", ports)
    return given


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_seaweed_retries_a_taken_port(monkeypatch, busy_port):
    given = _taken_first(monkeypatch, busy_port, times=1)
    with SeaweedS3(bucket="retry") as s3:
        assert given[0] == busy_port and s3.port == given[1] != busy_port
        args = " ".join(s3.proc.args)
        for name in ("master", "volume", "filer", "s3", "admin"):
            assert f"-{name}.port=" in args and f"-{name}.port.grpc=" in args, name
        log = open(f"{s3.dir}/server.log").read()
        assert f"port {busy_port} for S3" in log  # the first launch's failure, kept
        store = Store.open(s3.url("after-retry"), s3.storage_options())
        store.put("o", b"x")  # the server of the second launch serves
        assert bytes(store.get("o")) == b"x"


def test_seaweed_gives_up_after_the_tries(monkeypatch, busy_port):
    given = _taken_first(monkeypatch, busy_port, times=testing.START_TRIES)
    server = SeaweedS3(bucket="never")
    with pytest.raises(ServerExitedEarly, match="SeaweedFS S3 exited early"):
        server.start()
    server.stop()
    assert given == [busy_port] * testing.START_TRIES


def test_a_stopped_seaweed_leaves_no_sockets_in_tmp():
    """``weed mini`` makes its services' sockets at fixed paths in /tmp
    (``seaweedfs-<service>-grpc-<port>.sock``, ``seaweedfs-filer-<port>.sock``), which a
    SIGKILL leaves: every start of the suite's servers left about 6 there."""
    with SeaweedS3(bucket="sockets") as s3:
        ports = {a.split("=")[1] for a in s3.proc.args if re.match(r"-\w+\.port(\.grpc)?=", a)}
        assert len(ports) == 10
        made = [p for p in s3.sockets if p.exists()]
        assert len(made) >= 4 and all(p.is_socket() for p in made)  # the names are weed's
        assert (Path(s3.dir) / "filer.sock").is_socket()  # moved into its folder
        folder = Path(s3.dir)
    left = [p for p in Path("/tmp").glob("seaweedfs-*.sock") if p.stem.rsplit("-", 1)[1] in ports]
    assert left == [] and not folder.exists()


def test_a_seaweed_server_writes_its_logs_in_its_own_folder(tmp_path, monkeypatch):
    """``weed`` writes glog files (``weed.<host>.<user>.log.INFO.<time>.<pid>``, links
    ``weed.INFO``, ``weed.WARNING``) to the temporary folder unless given ``-logdir``: every
    server of the suite left them in /tmp. Here the server's temporary folder is a test's."""
    temp, own = tmp_path / "temp", tmp_path / "own"
    temp.mkdir()
    own.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # weed's (Go's os.TempDir), not this process's
    with SeaweedS3(bucket="logs", workdir=str(own)) as s3:
        Store.open(s3.url("x"), s3.storage_options()).put("o", b"x")
        assert list(Path(s3.dir).glob("weed.*.log.INFO.*"))  # glog's files: here
    assert list(temp.iterdir()) == []
