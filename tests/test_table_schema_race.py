"""Two writers creating one table with the same flat Arrow type but different tensor shapes.

Both store ``x`` as ``fixed_size_list<float>[6]``; only the shape metadata differs
(``[2, 3]`` vs ``[3, 2]``). The shape is part of the schema: the loser is refused with an
error naming the column and both shapes, and the winner's rows keep the winner's shape.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import treadle as td
from treadle.errors import CommitConflict, SchemaMismatch

A = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)  # 2 frames of [2, 3]
B = (100 + np.arange(2 * 3 * 2, dtype=np.float32)).reshape(2, 3, 2)  # 2 frames of [3, 2]


def _read_back(branch, name):
    """Every row of ``x`` through a TrainLoader batch (moment order restored)."""
    recipe = td.Recipe(seed=0, batch_size=2, components=[td.Component(branch.table(name))])
    batch = next(iter(td.TrainLoader(recipe)))
    order = np.argsort(batch["_moment"].numpy())
    return batch["x"].numpy()[order]


def _assert_names_both(err, first, second):
    msg = str(err)
    assert "'x'" in msg and str(list(first)) in msg and str(list(second)) in msg, msg


def test_rebase_onto_another_shape_is_refused(any_root):
    root, opts = any_root
    branch = td.Client(root, opts).project("p").branch("main")
    # both transactions start before the table exists: the outer one meets the inner
    # one's table only when it rebases its commit
    with pytest.raises(CommitConflict) as err:
        with branch.transaction("loser") as loser:
            loser.table("t").append_episode({"x": B}, episode="b")
            with branch.transaction("winner") as tx1:
                tx1.table("t").append_episode({"x": A}, episode="a")
    _assert_names_both(err.value, (2, 3), (3, 2))
    assert branch.head().id == tx1.commit.id
    got = _read_back(branch, "t")
    assert got.shape == (2, 2, 3)
    np.testing.assert_array_equal(got, A)


def test_racing_creators_one_shape_wins(local_root):
    client = td.Client(local_root)
    branch = client.project("p").branch("main")
    values = {"a": A, "b": B}
    for round_ in range(3):
        name = f"t{round_}"
        start = threading.Barrier(2)
        outcome: dict[str, BaseException | None] = {}

        def write(episode, name=name, start=start, outcome=outcome):
            start.wait()
            try:
                branch.table(name).append_episode({"x": values[episode]}, episode=episode)
                outcome[episode] = None
            except Exception as exc:  # recorded and checked below
                outcome[episode] = exc

        threads = [threading.Thread(target=write, args=(ep,)) for ep in values]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [e for e, err in outcome.items() if err is None]
        assert len(winners) == 1, outcome
        (winner,) = winners
        (loser,) = set(values) - {winner}
        err = outcome[loser]
        assert isinstance(err, (CommitConflict, SchemaMismatch)), repr(err)
        _assert_names_both(err, values[winner].shape[1:], values[loser].shape[1:])
        got = _read_back(branch, name)
        assert got.shape == values[winner].shape
        np.testing.assert_array_equal(got, values[winner])
        assert branch.table(name).pin().episodes().names == [winner]
