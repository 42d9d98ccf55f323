"""A ``workers=N`` loader dropped in a reference cycle and collected by the garbage collector
ends its workers once, on the reaper, closing each of its descriptors once.

The collector runs every finalizer of a cycle before any of its objects goes: the loader's
generator hands the workers' end to the reaper, but the pipes' own ``__del__`` (and the
processes' ``weakref`` finalizers) closed their descriptors in the same pass. The reaper then
closed those numbers again: by then perhaps another file's (a pipe, a socket, a server's log
opened meanwhile), which some other thread lost, or waited on.
"""

from __future__ import annotations

import gc
import logging
import os
import threading

import numpy as np
import pytest

import treadle as td
from descriptors import is_open
from treadle import reaper


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = tmp_path_factory.mktemp("collected") / "store"
    rng = np.random.default_rng(0)
    branch = td.Client(str(root), create=True).project("p").branch()
    with branch.transaction("episodes") as tx:
        for e in range(2):
            tx.table("t").append_episode(
                {"action": rng.random((40, 3), dtype=np.float32)}, episode=f"e{e}"
            )
    return td.Client(str(root)).project("p").branch().table("t")


def test_a_collected_worker_loader_closes_each_descriptor_once(table, caplog):
    windows = td.Windows({"action": td.Rows(range(4))})
    recipe = td.Recipe(seed=1, batch_size=4, components=[td.Component(table, windows)])
    it = iter(td.TrainLoader(recipe, steps=1000, workers=2))
    next(it)
    next(it)  # from a worker: both are started
    cycle = [it]
    cycle.append(cycle)
    del it, cycle
    gate = threading.Event()
    reaper.start()
    reaper.reap(gate.wait, 30)  # the reaper ends the workers after the collection
    gc.collect()
    others = [os.pipe() for _ in range(16)]  # files opened meanwhile take the free numbers
    with caplog.at_level(logging.WARNING, logger="treadle"):
        gate.set()
        assert reaper.drain(60)
    lost = [fd for pair in others for fd in pair if not is_open(fd)]
    for pair in others:
        for fd in pair:
            if is_open(fd):
                os.close(fd)
    assert not lost, f"the reaper closed descriptors it did not own: {lost}"
    assert "cleanup handed to the reaper failed" not in caplog.text, caplog.text
