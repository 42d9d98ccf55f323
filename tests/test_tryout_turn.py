"""What a new user ran into trying issues 44, 46 and 47's features from the docs."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td


@pytest.fixture(scope="module")
def grasps(tmp_path_factory):
    """A 5-moment table: a string split into characters would fit it exactly."""
    client = td.Client(str(tmp_path_factory.mktemp("turn") / "root"), create=True)
    ref = client.project("robotics").branch("main").table("grasps")
    ref.append_episode({"x": np.arange(5, dtype=np.float32)}, episode="g-0", fps=10)
    return ref


def test_add_column_refuses_a_string_as_per_moment_values(grasps):
    # before: "hello" was stored one character per moment ('h', 'e', 'l', 'l', 'o')
    before = grasps.pin().version
    with pytest.raises(td.SchemaMismatch, match=r"column 'label'.*got str"):
        grasps.add_column("label", "hello")
    assert grasps.pin().version == before
