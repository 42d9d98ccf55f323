"""``workers=N``: batches come through shared-memory slots, equal to ``workers=0``'s, in order,
with resume, errors, growth of the slots and early close."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
import torch

import treadle as td
from loader_helpers import make_project, recipe
from treadle.plan.seeds import sample_seeds

pytestmark = pytest.mark.slow  # worker processes


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("wvideo") / "store")
    return root, make_project(root, episodes=2, frames=16)


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """Two image+action tables with a string column (bench case 1's shape, smaller)."""
    root = str(tmp_path_factory.mktemp("wmix") / "store")
    branch = td.Client(root, create=True).project("p").branch()
    for i, (name, n) in enumerate((("fails", 40), ("nominal", 70))):
        rng = np.random.default_rng(i)
        branch.table(name).append(
            {
                "image": rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
                "action": rng.standard_normal((n, 7), dtype=np.float32),
                "task": [f"{name} {j} " * (j % 4) for j in range(n)],
            }
        )
    comps = [
        td.Component(branch.table(t), None, weight=w) for t, w in (("fails", 0.3), ("nominal", 0.7))
    ]
    return root, td.Recipe(seed=5, batch_size=16, components=comps)


def _same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert list(g) == list(w)
        for k in w:
            if isinstance(w[k], torch.Tensor):
                assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape, k
                assert torch.equal(g[k], w[k]), k
            else:
                assert g[k] == w[k], k


def with_pids(batch, seeds):
    """Which process read the batch, and its parent (module level: it pickles)."""
    n = len(seeds)
    batch["pid"] = torch.full((n,), os.getpid(), dtype=torch.int64)
    batch["ppid"] = torch.full((n,), os.getppid(), dtype=torch.int64)
    return batch


def ragged(batch, seeds):
    """A column whose width changes from batch to batch (the slots must grow)."""
    width = int(seeds[0] % 5000) + 1
    batch["pad"] = torch.arange(len(seeds) * width, dtype=torch.float64).reshape(-1, width)
    batch["half"] = batch["action"].to(torch.bfloat16)  # no numpy dtype: travels pickled
    return batch


class FailAt:
    """A transform that fails on the batch whose first sample has seed ``seed``."""

    def __init__(self, seed: int):
        self.seed = seed

    def __call__(self, batch, seeds):
        if int(seeds[0]) == self.seed:
            raise ValueError(f"bad sample with seed {self.seed}")
        return batch


class SlowAt:
    """A transform that takes ``seconds`` on the batch whose first sample has seed ``seed``."""

    def __init__(self, seed: int, seconds: float):
        self.seed, self.seconds = seed, seconds

    def __call__(self, batch, seeds):
        if int(seeds[0]) == self.seed:
            time.sleep(self.seconds)
        return batch


def test_a_worker_slow_to_deliver_is_named_while_the_loader_waits(mix, monkeypatch, caplog):
    """A worker that delivered nothing for minutes (hung in a read or a transform) left the
    loader waiting without a word; it now says which worker, which step and how long, and
    goes on waiting: the slow batch still comes, the batches are workers=0's."""
    from treadle.workers import processes

    _, rec = mix
    seed = int(sample_seeds(rec.seed, np.array([2 * rec.batch_size]))[0])  # step 2's first
    monkeypatch.setattr(processes, "STALL_WARN_S", 0.2)
    caplog.set_level(logging.WARNING, logger="treadle.workers.processes")
    got = list(td.TrainLoader(rec, steps=4, transform=SlowAt(seed, 3.0), workers=2))
    _same(got, list(td.TrainLoader(rec, steps=4, transform=SlowAt(seed, 0.0))))
    said = [
        r.getMessage() for r in caplog.records if "has not delivered step 2 in" in r.getMessage()
    ]
    assert said, "nothing said of step 2"  # its worker, every 0.2 s of the 3 s it slept
    assert "worker process 0 (pid " in said[0] and said[-1].endswith("s; still waiting")
    assert [float(m.split(" in ")[1].split()[0]) for m in said][:2] in ([0.2], [0.2, 0.4])


def test_mix_batches_are_copies_out_of_slots_equal_to_workers_0(mix):
    _, rec = mix
    want = list(td.TrainLoader(rec, steps=12))
    loader = td.TrainLoader(rec, steps=12, workers=2)
    got = list(loader)  # every batch kept to the end: a reused slot must not change one
    _same(got, want)
    assert loader.step == 12
    for b in got:  # own memory, not torch's per-tensor shared-memory segments
        assert not any(t.is_shared() for t in b.values() if isinstance(t, torch.Tensor))
    assert isinstance(got[0]["task"], list) and isinstance(got[0]["task"][0], str)


def test_video_batches_equal_workers_0_and_eval_too(video):
    _, branch = video
    plan = recipe(branch).plan()
    _same(list(td.TrainLoader(plan, steps=6, workers=2)), list(td.TrainLoader(plan, steps=6)))
    comp = td.Component(branch.table("failed"), td.Windows({"cam": td.Video(range(4))}))
    _same(list(td.EvalLoader(comp, 8, workers=2)), list(td.EvalLoader(comp, 8)))


def test_float_video_from_workers_is_uint8_over_255_exactly(video):
    _, branch = video
    table = branch.table("failed")
    u8 = td.Component(table, td.Windows({"cam": td.Video(range(4))}))
    f32 = td.Component(table, td.Windows({"cam": td.Video(range(4), dtype="float32")}))
    want = [torch.tensor(b["cam"].numpy(), dtype=torch.float32) / 255 for b in td.EvalLoader(u8, 8)]
    got = [b["cam"] for b in td.EvalLoader(f32, 8, workers=2)]
    assert len(got) == len(want) > 0
    assert all(g.dtype == torch.float32 and torch.equal(g, w) for g, w in zip(got, want))


def test_resume_with_workers_continues_at_the_next_step(video):
    root, branch = video
    plan = recipe(branch).plan()
    want = list(td.TrainLoader(plan, steps=7))
    loader = td.TrainLoader(plan, steps=7, workers=2)
    it = iter(loader)
    got = [next(it), next(it), next(it)]
    state = loader.state_dict()
    it.close()
    assert state["step"] == 3
    again = td.TrainLoader.from_state(state, td.Client(root), steps=7, workers=3)
    _same(got + list(again), want)


def test_slots_grow_and_odd_columns_travel_pickled(mix):
    _, rec = mix
    want = list(td.TrainLoader(rec, steps=8, transform=ragged))
    assert len({b["pad"].shape[1] for b in want}) > 1
    _same(list(td.TrainLoader(rec, steps=8, transform=ragged, workers=2, prefetch=1)), want)


def test_an_error_in_a_worker_is_raised_with_its_message_at_its_step(mix):
    _, rec = mix
    seed = int(sample_seeds(rec.seed, np.array([2 * rec.batch_size]))[0])  # step 2's first
    loader = td.TrainLoader(rec, steps=4, transform=FailAt(seed), workers=2)
    got = []
    with pytest.raises(ValueError, match=f"bad sample with seed {seed}") as e:
        for b in loader:
            got.append(b)
    assert len(got) == 2 and loader.step == 2
    assert any("treadle worker process 0" in n for n in getattr(e.value, "__notes__", []))
    assert "in the transform at step 2" in getattr(e.value, "__notes__", [])


def test_workers_fork_from_a_server_and_end_when_the_loader_closes(mix):
    _, rec = mix
    loader = td.TrainLoader(rec, steps=None, transform=with_pids, workers=2)
    it = iter(loader)
    first, second = next(it), next(it)
    pids = {int(first["pid"][0]), int(second["pid"][0])}
    assert len(pids) == 2 and os.getpid() not in pids
    # forked from the preloaded server, not started by this process (no Python start-up)
    assert {int(first["ppid"][0]), int(second["ppid"][0])} != {os.getpid()}
    it.close()  # an early break on an endless loader
    for _ in range(200):
        if not any(os.path.exists(f"/proc/{p}") for p in pids):
            break
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)


def test_messages_travel_the_pipe_and_a_wrong_step_is_named():
    # the protocol of treadle.workers.messages, as a worker's pipe carries it
    import multiprocessing as mp

    from treadle.workers import messages
    from treadle.workers.processes import _Handle

    recv, send = mp.Pipe(duplex=False)
    send.send(messages.batch(7, 1, {"x": (0, 8)}))
    send.send(messages.error(td.PlanError("bad step")))
    send.send(messages.end())
    got = [recv.recv() for _ in range(3)]
    assert got[0] == ("batch", 7, 1, {"x": (0, 8)}) and got[0].slot == 1
    assert got[1].kind == messages.ERROR and str(got[1].payload) == "bad step"
    assert got[2] == messages.Message("end")

    class _Proc:  # a worker that already sent its messages and went
        exitcode = 0

        def join(self, timeout=None):
            pass

    w = _Handle.__new__(_Handle)  # the loader's side of one worker, without a process
    w.k, w.proc, w.inbox, w.outbox, w.slots = 0, _Proc(), recv, send, []
    w.home = os.getpid()  # the loader's process (a forked child's copy is not its owner)
    send.send(messages.batch(8, 0, None))
    with pytest.raises(td.TreadleError, match="worker process 0 sent batch 8, not step 7"):
        w.take(7)
    send.send(messages.error(td.PlanError("bad step")))
    with pytest.raises(td.PlanError, match="bad step"):
        w.take(7)


def test_without_a_transform_the_loader_reads_its_first_step_while_the_workers_start(
    video, monkeypatch
):
    # issue 33 (cold start): the first batch waited for the worker server's imports
    # (~0.5 s of CPU); now this process reads it, and the workers start meanwhile
    import threading

    import treadle.read.steps as steps_mod
    from treadle.workers import processes

    starting, here = threading.Event(), []
    start = processes._Handle.__init__

    def starts(self, *a, **k):
        starting.set()
        start(self, *a, **k)

    class Spy(steps_mod.SampleReader):
        def read_many(self, samples):
            samples = list(samples)
            here.append(([s.step for s in samples], starting.wait(120), self._fixed is None))
            return super().read_many(samples)

    _, branch = video
    plan = recipe(branch).plan()
    want = list(td.TrainLoader(plan, steps=5))
    monkeypatch.setattr(processes._Handle, "__init__", starts)
    monkeypatch.setattr(steps_mod, "SampleReader", Spy)
    loader = td.TrainLoader(plan, steps=5, workers=2)
    loader.load_state_dict({"record": plan.record.to_dict(), "step": 1})
    _same(list(loader), want[1:])
    # step 1 only, read here (Lance takes, no resident columns) while a worker started
    assert here == [([1], True, True)]
    here.clear()
    got = list(td.TrainLoader(plan, steps=3, workers=2, transform=with_pids))
    assert len(got) == 3 and os.getpid() not in {int(b["pid"][0]) for b in got}
    assert here == []  # with a transform every batch comes from a worker (it runs there)


def test_a_one_step_workers_loader_starts_no_worker(video, monkeypatch):
    from treadle.workers import processes

    started = []
    monkeypatch.setattr(processes._Handle, "__init__", lambda self, *a: started.append(a))
    _, branch = video
    plan = recipe(branch).plan()
    _same(list(td.TrainLoader(plan, steps=1, workers=2)), list(td.TrainLoader(plan, steps=1)))
    assert started == []
