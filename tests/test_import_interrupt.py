"""An import interrupted while a read of its source hangs exits, and commits nothing.

The source is a real MDS dataset on the S3 server behind a proxy that holds every HEAD of
a shard file for an hour (a server that accepted the request and never answers). Those
HEADs run on the importer's thread pool; before the fix, Ctrl-C raised in the main thread
but the pool's non-daemon threads held the process until obstore gave up (its timeout
times its retries: minutes). The import runs in a subprocess; joins are hang guards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from fault_proxy import FaultProxy
from importer_fixtures import make_mds, make_wds
from test_import_s3 import _upload
from treadle.catalog import Client

pytestmark = pytest.mark.s3

SCRIPT = textwrap.dedent(
    """
    import faulthandler, json, signal, sys
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's view of a hang
    # Ctrl-C as a terminal's Python has it, also where this suite runs as a background job
    # (its shell starts it with SIGINT ignored, which Python then leaves ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from treadle.catalog import Client
    from treadle.importers import mds, webdataset

    root, src, opts, fmt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    project = Client(root).project("p")
    fn = mds if fmt == "mds" else webdataset
    fn(src, project, "t", source_options=opts, progress=False)
    """
)


MASKS = ("SigBlk", "SigIgn")


def _sigint_state(pid: int) -> str:
    """SIGINT's bit in the process's blocked and ignored masks (``/proc``), for messages."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    masks = {k: int(v, 16) for k, v in (ln.split(":\t", 1) for ln in lines) if k in MASKS}
    return ", ".join(f"{k} {bool(m >> (signal.SIGINT - 1) & 1)}" for k, m in masks.items())


def _wait_for(cond, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# what the proxy holds: MDS shard HEADs run on ordered_map's pool; WebDataset tar GETs
# run in the producer thread of append_tables' prefetch (the consumer waited on it)
HUNG = {"mds": (("HEAD",), "shard."), "webdataset": (("GET",), ".tar")}


@pytest.mark.parametrize("fmt", ["mds", "webdataset"])
def test_ctrl_c_during_a_hung_source_read_exits_and_commits_nothing(tmp_path, s3_server, fmt):
    opts = s3_server.storage_options()
    src = s3_server.url(f"src-hung-{fmt}-{os.getpid()}-{tmp_path.name}")
    if fmt == "mds":
        make_mds(tmp_path / "src", n=30, compression="zstd", size_limit=1 << 12)
        arg = src
    else:
        arg = src + "/" + Path(make_wds(tmp_path / "src", n=30, per_shard=10)).name
    _upload(tmp_path / "src", src, opts)
    root = str(tmp_path / "root")
    branch = Client(root, create=True).project("p").branch("main")
    with branch.transaction("a first commit") as tx:
        tx.table("a").append_episode({"x": np.zeros((2, 2), np.float32)}, episode="e0")
    before = [c.id for c in branch.log()]
    script = tmp_path / "hung_import.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with FaultProxy(
        s3_server.endpoint,
        rate=1.0,
        kinds=("delay",),
        delay_s=3600,
        methods=HUNG[fmt][0],
        paths=HUNG[fmt][1],
    ) as proxy:
        proc = subprocess.Popen(
            [sys.executable, str(script), root, arg, json.dumps(proxy.options(opts)), fmt],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert _wait_for(lambda: proxy.counts["delay"] >= 1), "no read reached the proxy"
            time.sleep(0.5)  # the pool's threads are all inside their held HEADs
            assert proc.poll() is None, proc.communicate()
            state = _sigint_state(proc.pid)
            proc.send_signal(signal.SIGINT)
            t0 = time.monotonic()
            try:
                _, err = proc.communicate(timeout=60)  # a hang guard, not a speed limit
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack
                time.sleep(1)
                proc.kill()
                _, err = proc.communicate()
                pytest.fail(f"the interrupted import did not exit within 60 s ({state}):\n{err}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    print(f"exited {time.monotonic() - t0:.1f} s after SIGINT, code {proc.returncode}")
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err, err[-2000:]
    branch = Client(root).project("p").branch("main")
    assert [c.id for c in branch.log()] == before
    assert "t" not in branch.tables()
