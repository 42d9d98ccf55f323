"""Where ``plan.stats`` keeps its results (``projects/<p>/runstats/<run id>/``), how a
derive function is keyed, and the warning for dimensions no normaliser can divide by."""

from __future__ import annotations

import functools
import hashlib
import json
import marshal
import pickle
import types
import warnings
from typing import Any

import numpy as np

from treadle import layout
from treadle.errors import NotFound
from treadle.stats.column_stats import ColumnStats
from treadle.stats.table_stats import version_identity

Stats = tuple[dict[str, ColumnStats], dict[str, dict[str, ColumnStats]]]


def code_key(fn: Any) -> str:
    """A function by its code, the values it closes over, its defaults, the object it is
    bound to and the globals it names (functions by their own key, arrays and tensors by
    their bytes, other objects by their pickled state); ``"unkeyed"`` when that cannot be
    said (then not kept)."""
    try:
        return _callable_key(fn, set())
    except (_Unkeyed, RecursionError):  # a value that holds itself: not kept
        return "unkeyed"


def derive_keys(derived: dict[str, Any], version: str | int | None) -> dict[str, str]:
    """What keys each derive function's kept result: the caller's ``version`` (its word for
    what no key can see: the modules, files and C code a function reaches) and its
    :func:`code_key` when that can be said (else the version alone); ``"unkeyed"`` (computed
    every call, never kept) without a version."""
    if version is None:
        return {n: "unkeyed" for n in derived}
    keys = {n: code_key(f) for n, f in derived.items()}
    return {n: f"{type(version).__name__}:{version}" + ("" if k == "unkeyed" else f"|{k}")
            for n, k in keys.items()}  # fmt: skip


class _Unkeyed(Exception):
    """A value whose key cannot be said."""


def _names(code: Any) -> list[str]:
    """The global names ``code`` and the code nested in it (lambdas, comprehensions) use."""
    out = list(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            out += _names(const)
    return out


def _callable_key(fn: Any, seen: set[int]) -> str:
    """A function's key; a ``functools.partial`` by its function and the arguments it binds,
    an object with a Python ``__call__`` by that method bound to it (its state), so neither
    is keyed by the derive_version alone (``scale=3`` read back the result of ``scale=2``)."""
    if isinstance(fn, functools.partial):
        bound = _value_key(list(fn.args), seen) + _value_key(dict(fn.keywords), seen)
        return f"partial:{_callable_key(fn.func, seen)}:{bound}"
    call = next((vars(c)["__call__"] for c in type(fn).__mro__ if "__call__" in vars(c)), None)
    if getattr(fn, "__code__", None) is None and hasattr(call, "__code__"):
        return _function_key(fn.__call__, seen)
    return _function_key(fn, seen)


def _function_key(fn: Any, seen: set[int]) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        raise _Unkeyed
    if id(code) in seen:  # a recursive helper: its code is already in the key
        return f"recursive:{code.co_name}"
    seen.add(id(code))
    cells = [getattr(cl, "cell_contents", None) for cl in (getattr(fn, "__closure__", None) or ())]
    cells += list(getattr(fn, "__defaults__", None) or ())
    cells += sorted((getattr(fn, "__kwdefaults__", None) or {}).items())
    if hasattr(fn, "__self__"):  # a bound method: its object's state decides it too
        cells.append(fn.__self__)
    names = getattr(fn, "__globals__", {})
    named = [f"{n}={_value_key(names[n], seen)}" for n in dict.fromkeys(_names(code))
             if n in names]  # fmt: skip
    try:
        blob = marshal.dumps(code)
    except ValueError:
        raise _Unkeyed from None
    keys = [_value_key(v, seen) for v in cells] + named
    return hashlib.sha256(blob + "|".join(keys).encode()).hexdigest()


def _value_key(v: Any, seen: set[int]) -> str:
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return f"{type(v).__name__}[{','.join(_value_key(x, seen) for x in v)}]"
    if isinstance(v, dict):
        items = sorted((_value_key(k, seen), _value_key(x, seen)) for k, x in v.items())
        return f"dict{items}"
    if isinstance(v, (types.FunctionType, types.MethodType)):
        return f"fn:{_function_key(v, seen)}"
    if isinstance(v, (type, types.ModuleType, types.BuiltinFunctionType, np.ufunc)):
        return f"{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', v.__name__)}"
    if hasattr(v, "__array__") and not isinstance(v, np.ndarray):
        detach = getattr(v, "detach", None)  # a torch tensor, on any device
        v = np.asarray(detach().cpu() if callable(detach) else v)
    if isinstance(v, np.ndarray):
        if v.dtype.hasobject:
            raise _Unkeyed
        return f"array{v.shape}{v.dtype}:{hashlib.sha256(np.ascontiguousarray(v)).hexdigest()}"
    try:  # any other object by its state (a torch module by its weights, a config by its fields)
        return f"pickle:{hashlib.sha256(pickle.dumps(v, protocol=4)).hexdigest()}"
    except Exception:  # noqa: BLE001 - what cannot be pickled is not kept
        raise _Unkeyed from None


class RunCache:
    """``projects/<p>/runstats/<run id>/<key>.json``: one object per call's arguments."""

    def __init__(self, plan: Any, spec: dict[str, Any]):
        project = plan.tables[0].project
        self.store = project.store
        ids = [version_identity(t) for t in plan.tables]
        self.ok = "unknown" not in ids and "unkeyed" not in spec["derive"].values()
        # "kept": bump when what a result holds changes (3: derived runs, derive [b, T], T = 1;
        # 4: samples count anchors)
        digest = hashlib.sha256(
            json.dumps({**spec, "ids": ids, "kept": 4}, sort_keys=True).encode()
        )
        self.names = [*spec["columns"], *spec["derive"]]  # the pooled result's keys, in order
        self.components = list(plan.components)
        self.path = layout.runstats_key(project.prefix, plan.run_id, digest.hexdigest()[:24])

    def get(self) -> Stats | None:
        if not self.ok:
            return None
        try:
            data = self.store.get(self.path)
        except NotFound:
            return None
        load = lambda m: {k: ColumnStats.from_dict(v) for k, v in m.items()}  # noqa: E731
        try:
            d = json.loads(data)
            pooled = load(d["pooled"])
            per = {name: load(m) for name, m in d["components"].items()}
            if list(pooled) != self.names or list(per) != self.components:
                raise ValueError("other columns or components than asked")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            warnings.warn(
                f"plan.stats: the kept plan.stats result {self.path} cannot be read ({e}); "
                "computing it afresh",
                UserWarning,
                stacklevel=4,
            )
            return None
        return pooled, per

    def put(self, got: Stats) -> None:
        if not self.ok:
            return
        pooled, per = got
        dump = lambda m: {k: v.to_dict() for k, v in m.items()}  # noqa: E731
        data = {"pooled": dump(pooled), "components": {n: dump(m) for n, m in per.items()}}
        self.store.put(self.path, json.dumps(data).encode())


def warn_flat(stats: dict[str, ColumnStats], where: str) -> None:
    """One warning per column whose std is 0, below 1e-12 of its scale, or has no values,
    and one per column holding NaN or infinite values."""
    for name, s in stats.items():
        std = np.asarray(s.std, np.float64)
        scale = np.maximum(np.abs(np.asarray(s.min)), np.abs(np.asarray(s.max)))
        bad = ~np.isfinite(np.asarray(s.mean, np.float64)) & (np.asarray(s.count) > 0)
        flat = (~(std > 1e-12 * scale) | (std == 0)) & ~bad
        for mask, what in (
            (flat, "has std 0 (or below 1e-12 of its scale, or no values)"),
            (bad, "holds NaN or infinite values (its statistics there are NaN or inf)"),
        ):
            if mask.any():
                warnings.warn(
                    f"plan.stats: column {name!r} of {where} {what} {_dims(mask, std.ndim)}: "
                    "normalising by it gives inf/NaN",
                    UserWarning,
                    stacklevel=4,
                )


def _dims(mask: np.ndarray, ndim: int) -> str:
    if not ndim:
        return ""
    dims = [tuple(int(i) for i in ix) for ix in np.argwhere(mask)]
    shown = [d[0] if len(d) == 1 else d for d in dims][:20]
    return f"in dimension(s) {shown}{' ...' if len(dims) > 20 else ''}"
