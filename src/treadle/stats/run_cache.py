"""Where ``plan.stats`` keeps its results (``projects/<p>/runstats/<run id>/``), how a
derive function is keyed, and the warning for dimensions no normaliser can divide by."""

from __future__ import annotations

import hashlib
import json
import marshal
import warnings
from typing import Any

import numpy as np

from treadle import layout
from treadle.errors import NotFound
from treadle.stats.column_stats import ColumnStats
from treadle.stats.table_stats import version_identity

Stats = tuple[dict[str, ColumnStats], dict[str, dict[str, ColumnStats]]]


def code_key(fn: Any) -> str:
    """A function by its code, the values it closes over, its defaults and the globals it
    names (arrays by their bytes); ``"unkeyed"`` when that cannot be said (then not kept)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return "unkeyed"
    cells = [getattr(cl, "cell_contents", None) for cl in (getattr(fn, "__closure__", None) or ())]
    names = getattr(fn, "__globals__", {})
    named = [(n, names[n]) for n in code.co_names if n in names]
    cells += list(getattr(fn, "__defaults__", None) or ())
    cells += sorted((getattr(fn, "__kwdefaults__", None) or {}).items())
    try:
        blob = marshal.dumps(code) + "|".join(map(_value_key, cells + named)).encode()
    except ValueError:
        return "unkeyed"
    return hashlib.sha256(blob).hexdigest()


def _value_key(v: Any) -> str:
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
        return f"{v[0]}={_value_key(v[1])}"
    if isinstance(v, np.ndarray):
        return f"array{v.shape}{v.dtype}:{hashlib.sha256(np.ascontiguousarray(v)).hexdigest()}"
    if isinstance(v, type) or callable(v) or type(v).__name__ == "module":
        return f"{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', repr(type(v)))}"
    return repr(v)


class RunCache:
    """``projects/<p>/runstats/<run id>/<key>.json``: one object per call's arguments."""

    def __init__(self, plan: Any, spec: dict[str, Any]):
        project = plan.tables[0].project
        self.store = project.store
        ids = [version_identity(t) for t in plan.tables]
        self.ok = "unknown" not in ids and "unkeyed" not in spec["derive"].values()
        digest = hashlib.sha256(json.dumps({**spec, "ids": ids}, sort_keys=True).encode())
        self.path = layout.runstats_key(project.prefix, plan.run_id, digest.hexdigest()[:24])

    def get(self) -> Stats | None:
        if not self.ok:
            return None
        try:
            d = json.loads(self.store.get(self.path))
        except NotFound:
            return None
        load = lambda m: {k: ColumnStats.from_dict(v) for k, v in m.items()}  # noqa: E731
        return load(d["pooled"]), {name: load(m) for name, m in d["components"].items()}

    def put(self, got: Stats) -> None:
        if not self.ok:
            return
        pooled, per = got
        dump = lambda m: {k: v.to_dict() for k, v in m.items()}  # noqa: E731
        data = {"pooled": dump(pooled), "components": {n: dump(m) for n, m in per.items()}}
        self.store.put(self.path, json.dumps(data).encode())


def warn_flat(stats: dict[str, ColumnStats], where: str) -> None:
    """One warning per column whose std is 0, below 1e-12 of its scale, or has no values."""
    for name, s in stats.items():
        std = np.asarray(s.std, np.float64)
        scale = np.maximum(np.abs(np.asarray(s.min)), np.abs(np.asarray(s.max)))
        flat = ~(std > 1e-12 * scale) | (std == 0)
        if flat.any():
            dims = [tuple(int(i) for i in ix) for ix in np.argwhere(flat)]
            shown = [d[0] if len(d) == 1 else d for d in dims][:20]
            at = f"in dimension(s) {shown}{' ...' if len(dims) > 20 else ''}" if std.ndim else ""
            warnings.warn(
                f"plan.stats: column {name!r} of {where} has std 0 (or below 1e-12 of its "
                f"scale, or no values) {at}: normalising by it gives inf/NaN",
                UserWarning,
                stacklevel=4,
            )
