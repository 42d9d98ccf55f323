"""Branch refs: a log of write-once objects, moved by compare-and-swap.

``refs/<branch>/<seq>.json`` holds the commit id at position ``seq``; the highest
seq is the head. Moving a branch from seq ``n`` writes ``n + 1`` with
put-if-absent, which both local disk and S3 (``If-None-Match: *``) do atomically:
of two writers racing from ``n`` exactly one wins, and nothing is ever overwritten.

Finding the head: seqs are contiguous from 0 (a seq is only written after the one
before it was read) and ref objects are never deleted, so the head is the last seq
present. A first lookup LISTs the branch's refs (one request a thousand refs: fewer round
trips than reading seqs for any history short of tens of thousands of commits); after
that the last seq seen is cached, and the head is found by reading ``seq + 1, + 2, + 4,
...`` until one is missing, then bisecting between (one GET when nothing moved, O(log k)
after others made k commits: it LISTed every ref after four, O(history) a commit for a
writer beside busy ones). A put-if-absent whose response was lost (a retried request that
finds its own earlier write) counts as won: the stored commit id is compared with ours.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass

from treadle import layout
from treadle.errors import CorruptData, NotFound
from treadle.storage import Store

_REF_NAME = re.compile(r"[0-9]{16}\.json")
_COMMIT_ID = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Head:
    seq: int
    commit_id: str


class RefLog:
    """The refs of one project."""

    def __init__(self, store: Store, project_prefix: str):
        self.store = store
        self.project_prefix = project_prefix
        self.prefix = layout.folder(project_prefix, layout.REFS)
        self._known: dict[str, Head] = {}
        self._lock = threading.Lock()

    def _key(self, branch: str, seq: int) -> str:
        return layout.ref_key(self.project_prefix, branch, seq)

    def branches(self) -> list[str]:
        return self.store.list_dirs(self.prefix)

    def head(self, branch: str) -> Head | None:
        with self._lock:
            known = self._known.get(branch)
        head = known or self._listed(branch)
        if head is None:
            return None
        step, missing = 1, None
        while missing is None:  # gallop: the last seq present is in (head, missing)
            nxt = self._read(branch, head.seq + step)
            if nxt is None:
                missing = head.seq + step
            else:
                head, step = nxt, step * 2
        while missing - head.seq > 1:
            mid = self._read(branch, (head.seq + missing) // 2)
            if mid is None:
                missing = (head.seq + missing) // 2
            else:
                head = mid
        return self._remember(branch, head)

    def _listed(self, branch: str) -> Head | None:
        """The last ref a LIST of the branch's refs shows (None: no ref), read."""
        keys = [k for k in self.store.list(f"{self.prefix}/{branch}") if k.endswith(".json")]
        if not keys:
            return None
        key = keys[-1]  # zero-padded: lexicographic order is numeric order
        name = key.rsplit("/", 1)[-1]
        if not _REF_NAME.fullmatch(name):
            raise CorruptData(f"ref object {key} is not a ref (refs are <16 digits>.json)")
        return self._parse(key, int(name[:-5]), self.store.get(key))

    def try_advance(self, branch: str, seq: int, commit_id: str) -> bool:
        """Write ``seq`` -> ``commit_id``; False when another writer already took ``seq``."""
        body = json.dumps({"seq": seq, "commit": commit_id, "time": time.time()}).encode()
        if self.store.put(self._key(branch, seq), body, if_absent=True):
            self._remember(branch, Head(seq, commit_id))
            return True
        there = self._read(branch, seq)  # our own write whose response was lost?
        return there is not None and there.commit_id == commit_id

    def _read(self, branch: str, seq: int) -> Head | None:
        key = self._key(branch, seq)
        try:
            data = self.store.get(key)
        except NotFound:
            return None
        return self._parse(key, seq, data)

    @staticmethod
    def _parse(key: str, seq: int, data: bytes) -> Head:
        try:
            body = json.loads(data)
            commit = body["commit"]
            said = body.get("seq")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise CorruptData(f"ref object {key} is not a valid ref") from None
        if said != seq:
            raise CorruptData(f"ref object {key} says seq {said}")
        if not isinstance(commit, str) or not _COMMIT_ID.fullmatch(commit):
            raise CorruptData(f"ref object {key} does not name a commit id")
        return Head(seq, commit)

    def _remember(self, branch: str, head: Head) -> Head:
        with self._lock:
            old = self._known.get(branch)
            if old is None or head.seq > old.seq:
                self._known[branch] = head
        return head
