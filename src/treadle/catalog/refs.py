"""Branch refs: a log of write-once objects, moved by compare-and-swap.

``refs/<branch>/<seq>.json`` holds the commit id at position ``seq``; the highest
seq is the head. Moving a branch from seq ``n`` writes ``n + 1`` with
put-if-absent, which both local disk and S3 (``If-None-Match: *``) do atomically:
of two writers racing from ``n`` exactly one wins, and nothing is ever overwritten.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from treadle.errors import CorruptData
from treadle.storage import Store


@dataclass(frozen=True)
class Head:
    seq: int
    commit_id: str


class RefLog:
    """The refs of one project."""

    def __init__(self, store: Store, project_prefix: str):
        self.store = store
        self.prefix = f"{project_prefix}/refs"

    def _key(self, branch: str, seq: int) -> str:
        return f"{self.prefix}/{branch}/{seq:016d}.json"

    def branches(self) -> list[str]:
        return self.store.list_dirs(self.prefix)

    def head(self, branch: str) -> Head | None:
        keys = [k for k in self.store.list(f"{self.prefix}/{branch}") if k.endswith(".json")]
        if not keys:
            return None
        key = keys[-1]  # zero-padded: lexicographic order is numeric order
        body = json.loads(self.store.get(key))
        seq = int(key.rsplit("/", 1)[-1].split(".")[0])
        if body.get("seq") != seq:
            raise CorruptData(f"ref object {key} says seq {body.get('seq')}")
        return Head(seq, body["commit"])

    def try_advance(self, branch: str, seq: int, commit_id: str) -> bool:
        """Write ``seq`` -> ``commit_id``; False when another writer already took ``seq``."""
        body = json.dumps({"seq": seq, "commit": commit_id, "time": time.time()}).encode()
        return self.store.put(self._key(branch, seq), body, if_absent=True)
