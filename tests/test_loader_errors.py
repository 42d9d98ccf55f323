"""Loader settings that cannot work are a named PlanError when the loader is made.

What each raised before: ``workers=1.5`` ran silently with 1 worker; ``prefetch=300,
workers=1`` raised ``ValueError: too many fds`` at the first batch; ``workers=2`` in a
daemon process ``AssertionError: daemonic processes are not allowed to have children`` at
the first batch; ``batch_size=2**40`` and ``Video(size=(10**5, 10**5))`` ``MemoryError`` at
the first batch (or in ``plan.batch(0)``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import treadle as td
from loader_helpers import make_project, recipe
from script_helpers import run_script
from treadle.errors import PlanError
from treadle.read.budget import batch_bytes_floor


@pytest.fixture(scope="module")
def branch(tmp_path_factory):
    return make_project(str(tmp_path_factory.mktemp("errors")), episodes=1, frames=8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"workers": 1.5}, r"workers must be an integer >= 0, got 1\.5"),
        ({"workers": True}, r"workers must be an integer"),
        ({"prefetch": 2.0}, r"prefetch must be an integer >= 1, got 2\.0"),
        ({"video_threads": 1.5}, r"video_threads must be an integer"),
        ({"workers": -1}, r"workers must be >= 0"),
        ({"prefetch": 300, "workers": 1}, r"prefetch=300 with workers=1.*at most 240"),
    ],
)
def test_bad_worker_settings_are_named(branch, kwargs, match):
    with pytest.raises(PlanError, match=match):
        td.TrainLoader(recipe(branch, batch_size=2), steps=1, **kwargs)


def test_the_largest_worker_prefetch_starts(branch):
    loader = td.TrainLoader(recipe(branch, batch_size=2), steps=1, workers=1, prefetch=240)
    assert next(iter(loader))["cam"].shape == (2, 4, 32, 32, 3)


def test_a_batch_over_physical_memory_is_refused_when_the_loader_is_made(branch):
    with pytest.raises(PlanError, match=r"one batch of 1099511627776 samples needs at least"):
        td.TrainLoader(recipe(branch, batch_size=2**40), steps=1)
    huge = td.Windows({"cam": td.Video([0], size=(10**5, 10**5)), "action": td.Rows([0])})
    r = td.Recipe(seed=0, batch_size=2, components=[td.Component(branch.table("nominal"), huge)])
    with pytest.raises(PlanError, match=r"GiB, more than this machine's .* Video\(size"):
        td.TrainLoader(r, steps=1)


def test_the_floor_counts_what_the_plan_fixes(branch):
    plan = recipe(branch, batch_size=2).plan()
    # per sample: 4 int64 ids, 4 frames of at least 1 pixel, 4 rows of 7 values
    assert batch_bytes_floor(plan, 2) == 2 * (32 + 4 * 3 + 4 * 7)


DAEMON = textwrap.dedent(
    """
    import multiprocessing, sys
    sys.path.insert(0, sys.argv[2])

    def child(root, q):
        import treadle as td
        from loader_helpers import recipe
        branch = td.Client(root).project("robotics").branch()
        try:
            td.TrainLoader(recipe(branch, batch_size=2), steps=1, workers=2)
            q.put("no error")
        except Exception as e:
            q.put(f"{type(e).__name__}: {e}")

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(sys.argv[1], q), daemon=True)
        p.start()
        print(q.get(timeout=120))
        p.join()
    """
)


@pytest.mark.slow
def test_workers_inside_a_daemon_process_are_named(branch, tmp_path):
    root, tests = branch.project.client.root, Path(__file__).parent
    proc = run_script(tmp_path, DAEMON, root, tests, name="daemon.py", timeout=180)
    out = proc.stdout.strip().splitlines()[-1]
    assert out.startswith("PlanError: workers=2 inside a daemon process"), out
    assert "workers=0" in out and "daemon=False" in out


def test_a_constant_where_selects_every_anchor_or_none(branch):
    """Before: where="true" was a PlanError quoting Lance ("Scans must request at least one
    column. Received only dynamic expressions: [(Literal ...")."""
    windows = td.Windows({"action": td.Rows(range(2))})

    def plan(where):
        comp = td.Component(branch.table("nominal"), windows, where=where)
        return td.Recipe(seed=0, batch_size=2, components=[comp]).plan()

    assert plan("true").eligible(0) == plan("1 = 1").eligible(0) == plan(None).eligible(0) == 7
    with pytest.raises(PlanError, match=r"selects no anchors: where='false'"):
        plan("false")
