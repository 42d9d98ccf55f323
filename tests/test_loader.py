"""TrainLoader, checkpoints and ScanDataset: the seed's three guarantees, end to end."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import treadle as td
from loader_helpers import batch_hash, make_project, recipe, sample_hashes
from loader_worker import AUGMENT

HERE = Path(__file__).parent
WORKER = str(HERE / "loader_worker.py")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("loader") / "store")
    branch = make_project(root)
    return root, branch


def test_batches_have_the_promised_shapes_and_content(project):
    root, branch = project
    plan = recipe(branch).plan()
    loader = td.TrainLoader(plan, steps=3)
    batches = list(loader)
    assert len(batches) == 3 and loader.step == 3
    b = batches[0]
    assert b["cam"].shape == (8, 4, 32, 32, 3) and b["cam"].dtype == torch.uint8
    assert b["action"].shape == (8, 4, 7) and b["action"].dtype == torch.float32
    assert b["_component"].dtype == torch.int64 and b["_moment"].shape == (8,)
    # the content is the planned rows: action window = rows moment..moment+3 of the table
    sample = plan.batch(0)
    assert b["_moment"].tolist() == sample.moment.tolist()
    for i in range(8):
        table = plan.table(int(sample.component[i]))
        rows = table.take(np.arange(sample.moment[i], sample.moment[i] + 4), ["action"])
        want = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
        assert np.array_equal(b["action"][i].numpy(), want)
    # video frames equal a sequential decode of the episode's stream
    from treadle.video import index_from_arrow
    from treadle.video._testing import reference_decode

    i = 0
    table = plan.table(int(sample.component[i]))
    eps = table.episodes()
    e = int(np.searchsorted(eps.starts, sample.moment[i], side="right") - 1)
    col = table.to_arrow(["cam"]).column("cam").slice(int(eps.starts[e]), int(eps.lengths[e]))
    key, _ = index_from_arrow(col)
    data = table.project.client.store.get(f"{table.project.prefix}/{key}")
    frames = reference_decode(data)
    t = int(sample.moment[i] - eps.starts[e])
    assert np.array_equal(b["cam"][i].numpy(), frames[t : t + 4])


def test_shares_and_ranks_split_the_global_batch(project):
    _, branch = project
    plan = recipe(branch).plan()
    full = [b for b in td.TrainLoader(plan, steps=4, world_size=1, rank=0)]
    for w in (2, 4):
        parts = [list(td.TrainLoader(plan, steps=4, world_size=w, rank=r)) for r in range(w)]
        for s in range(4):
            for r in range(w):
                got = parts[r][s]
                assert got["_moment"].tolist() == full[s]["_moment"][r::w].tolist()
                assert sample_hashes(got) == sample_hashes(full[s])[r::w]
    with pytest.raises(td.PlanError, match="divisible"):
        td.TrainLoader(plan, world_size=3, rank=0)


def test_state_dict_resume_and_refusal(project):
    root, branch = project
    plan = recipe(branch).plan()
    ref = [batch_hash(b) for b in td.TrainLoader(plan, steps=6)]
    loader = td.TrainLoader(plan, steps=6, prefetch=3)
    it = iter(loader)
    got = [batch_hash(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))  # JSON-serialisable
    assert state["step"] == 2  # delivered, not prefetched
    del it
    again = td.TrainLoader.from_state(state, td.Client(root), steps=6)
    assert got + [batch_hash(b) for b in again] == ref
    same = td.TrainLoader(recipe(branch), steps=6)
    same.load_state_dict(state)
    assert [batch_hash(b) for b in same] == ref[2:]
    other = td.TrainLoader(recipe(branch, seed=7), steps=6)
    with pytest.raises(td.PlanError, match="from run"):
        other.load_state_dict(state)
    for bad in ({"step": 1}, {"record": state["record"], "step": -1}, "x"):
        with pytest.raises(td.PlanError):
            td.TrainLoader.from_state(bad, td.Client(root))


def test_a_resumed_loader_needs_steps_again_and_its_docs_say_so(project):
    """A state is {record, step}: a loader resumed without steps= ran forever, though the
    original had steps=6, and neither state_dict's nor from_state's docstring said so."""
    import re

    root, branch = project
    state = td.TrainLoader(recipe(branch).plan(), steps=6).state_dict()
    state["step"] = 4
    assert len(td.TrainLoader.from_state(state, td.Client(root), steps=6)) == 2
    with pytest.raises(TypeError, match="without steps= has no length"):
        len(td.TrainLoader.from_state(state, td.Client(root)))  # unbounded
    for doc in (td.TrainLoader.state_dict.__doc__, td.TrainLoader.from_state.__doc__):
        assert re.search(r"steps=.*again.*runs forever", " ".join(doc.split()))


def test_workers_give_the_same_batches(project):
    _, branch = project
    plan = recipe(branch).plan()
    ref = [batch_hash(b) for b in td.TrainLoader(plan, steps=5)]
    loader = td.TrainLoader(plan, steps=5, workers=2)
    assert [batch_hash(b) for b in loader] == ref and loader.step == 5


def test_commit_mid_run_changes_nothing(tmp_path):
    root = str(tmp_path / "s")
    branch = make_project(root, episodes=2)
    plan = recipe(branch).plan()
    ref = [batch_hash(b) for b in td.TrainLoader(plan, steps=6)]
    loader = td.TrainLoader(recipe(branch), steps=6)
    got = []
    for i, b in enumerate(loader):
        got.append(batch_hash(b))
        if i == 1:  # a commit lands mid-run
            rng = np.random.default_rng(9)
            branch.table("failed").append_episode(
                {
                    "cam": td.VideoFrames(rng.integers(0, 255, (30, 32, 32, 3), np.uint8), fps=30),
                    "action": rng.random((30, 7), dtype=np.float32),
                },
                episode="late",
            )
    assert got == ref
    new = recipe(branch).plan()
    assert new.run_id != plan.run_id
    assert new.table(0).num_moments == plan.table(0).num_moments + 30


def test_checkpoints_are_rows(project, tmp_path):
    root, branch = project
    ckpts = td.Checkpoints(branch, table="ckpt_rows")
    assert ckpts.latest() is None
    plan = recipe(branch).plan()
    loader = td.TrainLoader(plan, steps=4)
    head_versions = dict(branch.head().tables)
    for i, _ in enumerate(loader):
        if i in (1, 3):
            ckpts.save(loader.step, {"w": torch.full((2,), float(i))}, loader)
    tables = branch.head().tables
    assert {k: v for k, v in tables.items() if k != "ckpt_rows"} == head_versions
    row = ckpts.latest(plan.run_id)
    assert row.step == 4 and row.loader_state["step"] == 4 and row.run_id == plan.run_id
    assert torch.equal(row.model_state()["w"], torch.full((2,), 3.0))
    assert recipe(branch).plan().run_id == plan.run_id  # checkpoints moved no pinned table
    assert ckpts.latest("abcd1234") is None
    with pytest.raises(td.PlanError):
        ckpts.latest("'; drop")


def _train(root, record_path, out, steps=12, every=3, augment=False):
    return subprocess.Popen(
        [sys.executable, WORKER, "train", root, record_path, str(steps), str(every), out]
        + (["augment"] if augment else []),
        cwd=str(HERE),
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
@pytest.mark.parametrize("augment", [False, True])
def test_crash_restart_gives_the_same_batches(tmp_path, augment):
    """With ``augment``: the seeded augmentations of loader_worker.AUGMENT replay exactly."""
    root = str(tmp_path / "s")
    branch = make_project(root)
    record_path = str(tmp_path / "record.json")
    plan = recipe(branch).plan()
    Path(record_path).write_text(plan.record.to_json())
    transform = AUGMENT if augment else None
    ref = [batch_hash(b) for b in td.TrainLoader(plan, steps=12, transform=transform)]

    out = str(tmp_path / "run.jsonl")
    rng = random.Random(1234)
    for _ in range(3):  # three crashes at random steps
        p = _train(root, record_path, out, augment=augment)
        target = rng.randint(2, 10)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            lines = Path(out).read_text().splitlines() if Path(out).exists() else []
            if len(lines) >= target:
                break
            time.sleep(0.05)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait()
    p = _train(root, record_path, out, augment=augment)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()[-2000:]
    seen: dict[int, set[str]] = {}
    for line in Path(out).read_text().splitlines():
        rec = json.loads(line)
        seen.setdefault(rec["step"], set()).add(rec["hash"])
    assert sorted(seen) == list(range(12))
    assert all(len(h) == 1 for h in seen.values()), "a step got two different batches"
    assert [seen[s].pop() for s in range(12)] == ref


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(root, record_path, world, start, stop, out):
    port = _free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), LOCAL_RANK=str(r))  # fmt: skip
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    WORKER,
                    "ranks",
                    root,
                    record_path,
                    str(start),
                    str(stop),
                    f"{out}.{r}",
                ],  # fmt: skip
                cwd=str(HERE),
                env=env,
                stderr=subprocess.PIPE,
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
    steps: dict[int, list] = {}
    for r in range(world):
        for line in Path(f"{out}.{r}").read_text().splitlines():
            rec = json.loads(line)
            g = steps.setdefault(rec["step"], [None] * 8)
            for k, slot in enumerate(range(r, 8, world)):
                g[slot] = (rec["component"][k], rec["moment"][k], rec["hash"][k])
    return steps


@pytest.mark.slow
def test_distributed_ranks_and_rank_count_change(tmp_path):
    root = str(tmp_path / "s")
    branch = make_project(root)
    plan = recipe(branch).plan()
    record_path = str(tmp_path / "record.json")
    Path(record_path).write_text(plan.record.to_json())
    ref = {}
    for s, b in enumerate(td.TrainLoader(plan, steps=6)):
        ref[s] = list(zip(b["_component"].tolist(), b["_moment"].tolist(), sample_hashes(b)))
    for world in (1, 2, 4):
        got = _run_ranks(root, record_path, world, 0, 3, str(tmp_path / f"w{world}"))
        assert {s: got[s] for s in range(3)} == {s: ref[s] for s in range(3)}, world
    # the 4-rank run's saved state continues on 2 ranks with the same global batches
    state = json.loads(Path(str(tmp_path / "w4") + ".0.state").read_text())
    assert state["step"] == 3
    Path(record_path + ".4").write_text(json.dumps(state["record"]))
    got = _run_ranks(root, record_path + ".4", 2, state["step"], 6, str(tmp_path / "w2b"))
    assert {s: got[s] for s in range(3, 6)} == {s: ref[s] for s in range(3, 6)}


@pytest.mark.parametrize("workers", [0, 2])
def test_scan_dataset_covers_every_row_once(project, workers):
    _, branch = project
    table = branch.table("nominal").pin()
    seen = []
    for rank in range(2):
        ds = td.ScanDataset(
            table.scan_request(["cam", "action"]), batch_size=5, shuffle=True, seed=3,
            rank=rank, world_size=2,
        )  # fmt: skip
        dl = torch.utils.data.DataLoader(
            ds, batch_size=None, num_workers=workers,
            multiprocessing_context="spawn" if workers else None,
        )  # fmt: skip
        for b in dl:
            assert b["cam"].shape[1:] == (32, 32, 3) and b["action"].shape[1:] == (7,)
            seen.extend(b["_moment"].tolist())
    assert sorted(seen) == list(range(table.num_moments))


def test_scan_dataset_state_and_filter(project):
    _, branch = project
    table = branch.table("failed").pin()
    ds = td.ScanDataset(table.scan_request(["action"]), batch_size=4)
    it = iter(ds)
    first = [next(it)["_moment"].tolist() for _ in range(3)]
    state = ds.state_dict()
    rest = [b["_moment"].tolist() for b in it]
    again = td.ScanDataset(table.scan_request(["action"]), batch_size=4)
    again.load_state_dict(state)
    assert [b["_moment"].tolist() for b in again] == rest
    assert sum(first + rest, []) == list(range(table.num_moments))
    only = td.ScanDataset(table.scan_request(["action"], filter="frame < 2"), batch_size=100)
    moments = next(iter(only))["_moment"].numpy()
    frames = table.take(moments, ["frame"]).column("frame").to_pylist()
    assert frames and set(frames) == {0, 1} and len(moments) == 2 * table.num_episodes
    with pytest.raises(td.PlanError):
        td.ScanDataset(table.scan_request(["action"]), batch_size=0)
    # a string column arrives as a Python list, one name per sample
    names = next(iter(td.ScanDataset(table.scan_request(["episode"]), batch_size=4)))
    rows = names["_moment"].numpy()
    assert names["episode"] == table.take(rows, ["episode"]).column("episode").to_pylist()


def test_scan_dataset_set_epoch_reshuffles_each_epoch_whole_and_replays(project):
    _, branch = project
    table = branch.table("failed").pin()
    ds = td.ScanDataset(table.scan_request(["action"]), batch_size=4, shuffle=True, seed=5)

    def epoch(e):
        ds.set_epoch(e)
        return sum((b["_moment"].tolist() for b in ds), [])

    e0, e1, e0_again = epoch(0), epoch(1), epoch(0)
    everything = list(range(table.num_moments))
    assert sorted(e0) == sorted(e1) == everything  # each epoch reads every row once
    assert e0 != e1 and e0 != everything  # a new order each epoch, shuffled
    assert e0_again == e0  # an epoch's order is a function of (seed, epoch)
    # set_epoch starts the epoch from its first batch, even after a mid-epoch resume
    it = iter(ds)
    next(it)
    ds.load_state_dict(ds.state_dict())
    assert epoch(1) == e1 and ds.state_dict() == {"epoch": 1, "yielded": len(ds)}
    plain = td.ScanDataset(table.scan_request(["action"]), batch_size=4)
    plain.set_epoch(3)  # no shuffle: table order in every epoch
    assert sum((b["_moment"].tolist() for b in plain), []) == everything


def test_device_selection(project):
    _, branch = project
    plan = recipe(branch).plan()
    from treadle.torch.delivery import plan_reader

    reader = plan_reader(plan, device="cpu")
    assert reader.backend.name == "cpu" and not reader.backend.on_device
    reader.close()
    if not torch.cuda.is_available():
        with pytest.raises(td.PlanError, match="CUDA is not available"):
            td.TrainLoader(plan, device="cuda")


@pytest.mark.parametrize(
    "a, b",
    [
        ({"action": td.Rows(range(4))}, {"action": td.Rows(range(2))}),
        ({"cam": td.Video(range(4))}, {"cam": td.Video(range(2))}),
        ({"cam": td.Video(range(2))}, {"cam": td.Video(range(2), dtype="float32")}),
        ({"cam": td.Video(range(2))}, {"cam": td.Video(range(2), layout="TCHW")}),
    ],
)
def test_components_whose_windows_cannot_stack_fail_at_the_loader(project, a, b):
    """Before: the loader was made and ran until the first batch mixing both components
    (step 164 with weights 0.999/0.001), then raised; for video, advice to give size=."""
    _, branch = project
    rec = td.Recipe(
        seed=3,
        batch_size=6,
        components=[
            td.Component(branch.table("failed"), td.Windows(a), weight=0.999),
            td.Component(branch.table("nominal"), td.Windows(b), weight=0.001),
        ],
    )
    col = next(iter(a))
    with pytest.raises(td.PlanError, match=f"column {col!r}: component 0 gives windows"):
        td.TrainLoader(rec, steps=3000)


def test_an_older_live_iterator_of_a_loader_stops_and_the_state_stays_exact(project):
    """Two live iterators of one TrainLoader share its step count: before, each went on with
    its own sequence (steps [0, 1, 1]: one delivered twice, step 2 never, and state_dict()
    said 3). Now the older one stops with an error and the newest delivers every step once."""
    _, branch = project
    want = [b["_moment"] for b in td.TrainLoader(recipe(branch, batch_size=4), steps=4)]
    loader = td.TrainLoader(recipe(branch, batch_size=4), steps=4)
    first = iter(loader)
    got = [next(first)["_moment"]]
    second = iter(loader)  # e.g. a peek with next(iter(loader)) kept alive, then a loop
    got.append(next(second)["_moment"])
    with pytest.raises(td.PlanError, match="iterated again"):
        next(first)
    assert loader.state_dict()["step"] == 2
    got += [b["_moment"] for b in second]
    assert [m.tolist() for m in got] == [m.tolist() for m in want]


def test_scan_dataset_refuses_forked_workers(project):
    _, branch = project
    ds = td.ScanDataset(branch.table("failed").pin().scan_request(["action"]), batch_size=4)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    with pytest.raises(RuntimeError, match="spawn"):
        next(iter(dl))


def test_checkpoint_state_is_checked(tmp_path):
    branch = td.Client(str(tmp_path / "s"), create=True).project("p").branch()
    branch.table("t").append({"x": np.arange(10, dtype=np.float32)})
    plan = td.Recipe(seed=1, batch_size=2, components=[td.Component(branch.table("t"))]).plan()
    loader = td.TrainLoader(plan, steps=1)
    list(loader)
    ckpts = td.Checkpoints(branch)
    ckpts.save(1, {"w": torch.ones(3)}, loader)
    assert torch.equal(ckpts.latest().model_state()["w"], torch.ones(3))
    # a damaged blob (written behind treadle's back) is caught, not unpickled
    import pyarrow as pa

    row = branch.table("checkpoints").to_arrow()
    bad = row.set_column(
        row.schema.get_field_index("state"), "state", pa.array([b"garbage"], pa.large_binary())
    )
    branch.table("checkpoints").append(bad)
    with pytest.raises(td.CorruptData, match="sha256"):
        ckpts.latest()
