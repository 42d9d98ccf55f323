"""The project's cached Lance handles are shared by threads: nothing treadle does to one of
them may borrow it mutably while another thread reads it."""

from __future__ import annotations

import threading

import numpy as np

import treadle as td


def test_protecting_a_version_while_another_thread_reads_its_handle(local_root):
    # Two writers racing to create one table failed in CI with Lance's RuntimeError
    # "Already mutably borrowed": the winner tagged its version through the cached handle
    # (a mutable borrow) while the loser read that handle's schema to rebase on it. Before
    # the fix this loop saw ~1,000 such errors in 200 tags.
    branch = td.Client(local_root).project("p").branch("main")
    branch.table("t").append_episode({"x": np.zeros((2, 3), np.float32)}, episode="a")
    project = branch.project
    version = project.load_commit(branch.head().id).tables["t"]
    errors: list[BaseException] = []
    done = threading.Event()

    def tag() -> None:
        try:
            for _ in range(200):
                project.lance.protect("t", version)
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    def read() -> None:
        while not done.is_set():
            try:
                assert project.lance.open("t", version).schema.names
            except BaseException as e:
                errors.append(e)

    threads = [threading.Thread(target=tag), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    tags = project.lance.load("t", None, "t").tags.list()
    assert f"treadle-v{version}" in tags
