"""A ScanDataset read by DataLoader worker processes: its position is theirs, not this copy's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import treadle as td


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    branch = td.Client(str(tmp_path_factory.mktemp("scan")), create=True).project("p").branch()
    branch.table("a").append_episode({"x": np.arange(40, dtype=np.float32)}, episode="e")
    return branch.table("a").pin().scan_request(["x"])


def test_a_state_of_a_dataset_its_workers_read_is_refused(scan):
    """After 3 batches through 2 spawned workers, ``state_dict()`` said ``yielded: 0`` (the
    workers' copies counted, not this one), so a resume read the first 3 batches again."""
    ds = td.ScanDataset(scan, 4)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    it = iter(dl)
    assert [next(it)["_moment"].tolist() for _ in range(3)][-1] == [8, 9, 10, 11]
    del it
    with pytest.raises(td.PlanError, match="worker processes"):
        ds.state_dict()


def test_a_resumed_position_is_not_skipped_again_by_each_worker(scan):
    """A position loaded into a dataset then read by 2 workers: each worker skipped it in its
    own share of the batches (6 batches of 10 gone, not 3)."""
    ds = td.ScanDataset(scan, 4)
    ds.load_state_dict({"epoch": 0, "yielded": 3})
    dl = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    with pytest.raises(td.PlanError, match="num_workers=0"):
        list(dl)
    alone = td.ScanDataset(scan, 4)  # read in this process, the position is exact
    alone.load_state_dict({"epoch": 0, "yielded": 3})
    assert [b["_moment"].tolist()[0] for b in alone] == [12, 16, 20, 24, 28, 32, 36]
    assert alone.state_dict() == {"epoch": 0, "yielded": 10}
