"""The lookahead stage's downloads (treadle.read.downloads): rounds download together and
end in the order they were reserved; a failure and a close give the room back."""

import threading
from collections import deque

import pytest

from treadle.read.downloads import Downloads, _Round


class Store:
    """Stands in for the chunk store: a download of store ``s`` waits for ``release[s]``."""

    def __init__(self):
        self.release: dict[str, threading.Event] = {}
        self.started: list[str] = []
        self.abandoned: list[list] = []
        self.lock = threading.Lock()

    def download(self, store, items):
        with self.lock:
            self.started.append(store)
        if store == "broken":
            raise OSError("the link went down")
        assert self.release.setdefault(store, threading.Event()).wait(30)

    def abandon(self, items):
        self.abandoned.append(items)


def ended_log():
    got, done = [], threading.Event()

    def ended(last, error):
        got.append((last, None if error is None else str(error)))
        done.set()

    return got, done, ended


def test_rounds_download_together_and_end_in_order():
    store = Store()
    got, _, ended = ended_log()
    d = Downloads(store, ended, threads=3)
    for name, last in (("a", 3), ("b", 7), ("c", 9)):
        store.release[name] = threading.Event()
        d.submit(last, [(name, [("obj", [last])])])
    for _ in range(300):  # all three under way at once
        if len(store.started) == 3:
            break
        threading.Event().wait(0.01)
    assert sorted(store.started) == ["a", "b", "c"]
    store.release["c"].set()
    store.release["b"].set()
    threading.Event().wait(0.1)
    assert got == []  # b and c ended, a not: nothing said (a reader would pass step 3)
    store.release["a"].set()
    d.drain()
    assert got == [(3, None), (7, None), (9, None)]
    d.close()
    d.join(10)


def test_a_failed_round_says_why_and_gives_back_the_rest():
    store = Store()
    got, done, ended = ended_log()
    d = Downloads(store, ended, threads=1)
    d.submit(5, [("broken", [("o1", [1])]), ("later", [("o2", [2])])])
    assert done.wait(30)
    assert got == [(5, "the link went down")]
    assert store.abandoned == [[("o2", [2])]] and "later" not in store.started
    d.close()
    d.join(10)


@pytest.mark.parametrize("threads", [1, 2])
def test_close_gives_back_the_rounds_not_started(threads):
    store = Store()
    got, _, ended = ended_log()
    d = Downloads(store, ended, threads=threads)
    store.release["x"] = threading.Event()
    for last in range(threads):  # every thread busy
        d.submit(last, [("x", [("o", [last])])])
    for _ in range(300):
        if len(store.started) == threads:
            break
        threading.Event().wait(0.01)
    blocked = threading.Thread(target=d.submit, args=(99, [("y", [("o", [99])])]))
    blocked.start()  # waits: as many rounds as threads are under way
    threading.Event().wait(0.1)
    assert blocked.is_alive()
    d.close()
    blocked.join(10)
    assert not blocked.is_alive() and store.abandoned == [[("o", [99])]]
    store.release["x"].set()
    d.join(10)
    assert "y" not in store.started
    assert [last for last, _ in got] == list(range(threads))  # those under way still end


def test_rounds_with_nothing_to_fetch_hold_no_thread():
    """Behind a slow download, rounds that had nothing to fetch (a window moving a step at a
    time: most rounds) are taken at once and told in order once the slow one ends. Before,
    each held a thread's slot until then, so the stage's thread stopped reserving after
    ``threads`` rounds (issue 48's bench: the reader waited for rounds not yet reserved)."""
    store = Store()
    got, _, ended = ended_log()
    d = Downloads(store, ended, threads=2)
    store.release["slow"] = threading.Event()
    d.submit(1, [("slow", [("obj", [1])])])
    submitted = threading.Event()

    def more():
        for last in range(2, 12):  # ten rounds with nothing to fetch, past the two threads
            d.submit(last, [[("slow", [])], [], [("slow", [("obj", [])])]][last % 3])
        submitted.set()

    threading.Thread(target=more, daemon=True).start()
    assert submitted.wait(10), "an empty round waited for a thread"
    assert got == []  # none passes the slow round's step
    store.release["slow"].set()
    d.drain()
    assert got == [(last, None) for last in range(1, 12)]
    assert store.started == ["slow"]  # nothing else was downloaded
    d.close()


def test_a_close_tells_no_round_past_one_never_fetched():
    """Closed while a round downloads and a later one waits: the waiting round gives its
    room back, and no round after it is told (a round told past one never fetched would let
    a reader pass steps whose chunks never came), even one with nothing to fetch."""
    store = Store()
    got, _, ended = ended_log()
    d = Downloads(store, ended, threads=1)
    store.release["a"] = threading.Event()
    d.submit(1, [("a", [("obj", [1])])])
    for _ in range(300):
        if store.started:
            break
        threading.Event().wait(0.01)
    with d._cond:  # queued behind a (a round waits so only until a thread is free)
        d._rounds.append(_Round(2, [("b", [("obj", [2])])]))
    d.submit(3, [("b", [("obj", [])])])  # nothing to fetch: ended at once, told after 2
    d.close()
    store.release["a"].set()
    d.join(10)
    assert got == [(1, None)]
    assert store.abandoned == [[("obj", [2])], [("obj", [])]]


class _CountedRounds(deque):
    """The rounds' queue, counting its walks (each idle thread woken walks it once)."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def test_a_round_with_nothing_to_fetch_wakes_no_download_thread():
    """Most rounds fetch nothing (every chunk present); each woke all eight idle threads,
    each of which took the GIL from the reader to find nothing to do (issue 48's bench)."""
    got, _, ended = ended_log()
    d = Downloads(Store(), ended, threads=8)
    threading.Event().wait(0.2)  # every thread waits for a round
    d._rounds = _CountedRounds(d._rounds)
    for last in range(50):
        d.submit(last, [("s", [("obj", [])])])  # nothing to fetch
        threading.Event().wait(0.002)  # room for any thread woken to look
    d.close()
    assert got == [(last, None) for last in range(50)]
    assert _CountedRounds.walks < 10  # a thread at close; before: 8 a round (400)
