"""``treadle simulate`` against a real run, with row windows: each chunked column is read at
its own window's offsets (a column the windows do not name at offset 0 only; a padded
window's rows clamped to the moment's episode), as the loader's lookahead fetches them
(:func:`treadle.read.chunk_needs.chunked_rows`). The run and its counting proxy are
``tests/test_simulate_measured.py``'s."""

from __future__ import annotations

import numpy as np
import pytest

import treadle as td
from test_simulate_measured import READ_AHEAD, STEPS, _measure
from treadle.plan.simulate import Link, Setup, simulate
from treadle.read.simpages import page_layout
from treadle.storage import Store
from treadle.storage.chunkstore import ChunkStore

CHUNK = 64 << 10
pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def remote(s3_server, tmp_path_factory):
    """One table of 12 episodes of 30 moments: a 12 KiB image and a 4 KiB state a moment."""
    path = tmp_path_factory.mktemp("simwin-local")
    table = td.Client(str(path), create=True).project("p").branch().table("a")
    rng = np.random.default_rng(3)
    for e in range(12):
        table.append_episode(
            {"image": rng.integers(0, 256, (30, 64, 64, 3), dtype=np.uint8),
             "state": rng.standard_normal((30, 1024)).astype(np.float32)},
            episode=f"ep-{e}",
        )  # fmt: skip
    url = s3_server.url(f"simwin-{id(tmp_path_factory)}")
    store = Store.open(url, s3_server.storage_options())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        store.put(f.relative_to(path).as_posix(), f.read_bytes())
    return url, s3_server.storage_options(), s3_server


WINDOWS = {
    "sparse": {"image": td.Rows([-8, 0])},
    "padded": {"image": td.Rows([-2, -1, 0], pad=True), "state": td.Rows([0, 4])},
}


def _recipe_of(windows):
    def recipe(client: td.Client, shuffle: object) -> td.Recipe:
        comp = td.Component(client.project("p").branch().table("a"), td.Windows(windows))
        return td.Recipe(seed=4, batch_size=8, components=[comp], shuffle=shuffle)

    return recipe


@pytest.mark.parametrize("name, ranks", [("sparse", 1), ("padded", 1), ("padded", 2)])
def test_windowed_columns_are_read_at_their_own_offsets(remote, tmp_path, monkeypatch, name,
                                                        ranks):  # fmt: skip
    """(Two ranks: ``LOCAL_WORLD_SIZE=2``, each also opening the other's data files.)"""
    if ranks > 1:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    recipe = _recipe_of(WINDOWS[name])
    measured, _ = _measure(remote, tmp_path, monkeypatch, ranks, None, recipe=recipe,
                           chunk=CHUNK)  # fmt: skip
    url, options, _ = remote
    plan = recipe(td.Client(url, storage_options=options), None).plan()
    layout = page_layout(plan.tables, ChunkStore(tmp_path / "layout", 1 << 30, CHUNK))
    assert len(layout[0].columns) == 2  # image and state, both through the chunk cache
    setup = Setup(1, ranks, 1 << 30, CHUNK, lookahead=1, sample_nodes=1, read_ahead=READ_AHEAD)
    (rep,) = simulate(plan, plan.tables, setup, Link(1e9, 0.03), range(STEPS), layout)
    assert measured == list(zip(rep.rank_gets, rep.rank_fetched))
