"""Micro-benchmark of the planner: per-batch cost at step 0 and 1e12, throughput, setup, resume,
and the cost of building a plan's share schedule.

Pure planning (no storage): tables are in-memory stand-ins with the attributes a pinned table
has. Prints tables; asserts nothing. Goals: < 1 ms per batch at any step for B=64 with 2-6
components; building a 16-component plan in < 1 s. The build rows clear the schedule memo first:
"random" has 16 weights p/q (random p, q <= 1000; shares within 1e-6, period <= 10**6/B), "1e6"
has 16 six-digit decimals summing to 1 (exact shares over 10**6, period 10**6 at odd B).

    python bench/plan_bench.py [--repeat N]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from treadle.plan.plan import Plan
from treadle.plan.recipe import Component, Recipe
from treadle.plan.record import RunRecord
from treadle.plan.stages import Schedule
from treadle.plan.windows import Rows, Windows


class _Table:
    def __init__(self, name: str, episodes: int, rng: np.random.Generator):
        self.name = name
        self.version = 1
        self.commit_id = "0" * 64
        self.project = SimpleNamespace(name="bench")
        self._lengths = rng.integers(100, 1000, size=episodes).astype(np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self._lengths)[:-1]]).astype(np.int64)
        self.num_moments = int(self._lengths.sum())
        self.schema = pa.schema(
            [("episode", pa.int64()), ("frame", pa.int64()), ("action", pa.float32())]
        )
        self.video_columns: list[str] = []

    def episodes(self) -> SimpleNamespace:
        return SimpleNamespace(names=None, starts=self._starts, lengths=self._lengths)

    def purged(self, fresh: bool = False) -> dict[str, Exception]:
        return {}  # a stand-in was never purged


class _Client:
    def __init__(self, tables: list[_Table]):
        self._tables = {t.name: t for t in tables}

    def project(self, name: str, create: bool = True) -> SimpleNamespace:
        return SimpleNamespace(table_at=lambda n, v, commit_id=None: self._tables[n])


def _recipe(components: int, batch_size: int, episodes: int, seed: int = 2048):
    rng = np.random.default_rng(0)
    tables = [_Table(f"t{i}", episodes, rng) for i in range(components)]
    weights = [0.001, 0.3, 0.123, 0.2, 0.17, 0.33][:components]
    windows = Windows({"action": Rows(range(90))})
    comps = [Component(t, windows, weight=w) for t, w in zip(tables, weights)]
    return Recipe(seed, batch_size, comps), tables


def rational_weights(components: int, kind: str, seed: int = 0, digits: int = 6) -> list[float]:
    """Weights for a build benchmark: "random" p/q floats, or "1e6" decimals over 10**digits
    that sum to 1 (their shares have denominator 10**digits)."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        p = rng.integers(1, 1001, size=components)
        q = rng.integers(1, 1001, size=components)
        return [float(a) / float(b) for a, b in zip(p, q)]
    scale = 10**digits
    cuts = np.sort(rng.choice(np.arange(1, scale), size=components - 1, replace=False))
    nums = np.diff(np.concatenate([[0], cuts, [scale]])).tolist()
    big = nums.index(max(nums))
    while math.gcd(nums[0], 10) != 1:  # one numerator prime to 10: the full period at odd B
        nums[0] += 1
        nums[big] -= 1
    return [n / scale for n in nums]


def build_ms(
    components: int, batch_size: int, kind: str, digits: int = 6, stages: int = 1
) -> tuple[float, Plan]:
    """Wall ms to plan a recipe of ``components`` tables with ``rational_weights`` (schedule
    memo cleared), and the plan; ``stages`` > 1: a ``td.Schedule`` of that many stages, each
    a rotation of the same weights."""
    from treadle.plan.schedule import pd2_masks

    rng = np.random.default_rng(1)
    tables = [_Table(f"t{i}", 20, rng) for i in range(components)]
    weights = rational_weights(components, kind, digits=digits)
    schedule = None
    if stages > 1:
        schedule = Schedule([(k * 10**6, weights[k:] + weights[:k]) for k in range(stages)])
    comps = [Component(t, None, w) for t, w in zip(tables, weights)]
    recipe = Recipe(7, batch_size, comps, schedule=schedule)
    pd2_masks.cache_clear()
    t = time.perf_counter()
    plan = recipe.plan()
    return (time.perf_counter() - t) * 1e3, plan


OXE_MIX = [  # (dataset, OpenVLA oxe_magic_soup-style weight, transitions; approximate sizes)
    ("fractal20220817_data", 0.54087122203, 3_786_400), ("kuka", 0.8341046294, 2_455_879),
    ("bridge_oxe", 1.0, 2_135_463), ("taco_play", 2.0, 237_798), ("jaco_play", 1.0, 77_965),
    ("berkeley_cable_routing", 1.0, 42_328), ("roboturk", 2.0, 187_507), ("viola", 2.0, 76_324),
    ("berkeley_autolab_ur5", 2.0, 97_939), ("toto", 1.0, 325_699),
    ("language_table", 0.1, 7_045_476), ("stanford_hydra", 2.0, 358_234),
    ("austin_buds", 1.0, 34_112), ("nyu_franka_play", 3.0, 44_875),
    ("furniture_bench", 0.1, 3_948_057), ("ucsd_kitchen", 2.0, 3_970),
    ("austin_sailor", 1.0, 353_094), ("austin_sirius", 1.0, 279_939),
    ("dlr_edan_shared_control", 1.0, 8_928), ("iamlab_cmu_pickup_insert", 1.0, 146_241),
    ("utaustin_mutex", 1.0, 361_883), ("berkeley_fanuc", 2.0, 62_613),
    ("cmu_stretch", 1.0, 25_016), ("bc_z", 0.2, 5_471_693), ("fmb", 1.0, 1_137_459),
    ("droid", 0.06, 27_044_326),
]  # fmt: skip
"""26 components, 3,970 to 27 million moments: the `weigh_by="moments"` build row."""


class _SizedTable(_Table):
    """A table of exactly ``moments`` moments in episodes of ``episode_length`` (the last
    shorter): counts only, no rows."""

    def __init__(self, name: str, moments: int, episode_length: int = 200):
        self.name, self.version, self.commit_id = name, 1, "0" * 64
        self.project = SimpleNamespace(name="bench")
        full, rest = divmod(moments, episode_length)
        self._lengths = np.full(full + (rest > 0), episode_length, dtype=np.int64)
        if rest:
            self._lengths[-1] = rest
        self._starts = np.concatenate([[0], np.cumsum(self._lengths)[:-1]]).astype(np.int64)
        self.num_moments = moments
        self.schema = pa.schema(
            [("episode", pa.int64()), ("frame", pa.int64()), ("action", pa.float32())]
        )
        self.video_columns: list[str] = []


def oxe_build_ms(batch_size: int, chunk: int) -> tuple[float, Plan, list[str]]:
    """Wall ms to plan the 26-table :data:`OXE_MIX` with ``weigh_by="moments"`` and an
    unpadded action chunk of ``chunk`` steps (schedule memo cleared), the plan and the
    PlanWarnings' texts."""
    import warnings

    from treadle.plan.schedule import pd2_masks

    tables = [_SizedTable(name, n) for name, _, n in OXE_MIX]
    windows = Windows({"action": Rows(range(chunk))})
    comps = [Component(t, windows, w) for t, (_, w, _) in zip(tables, OXE_MIX)]
    recipe = Recipe(7, batch_size, comps, weigh_by="moments")
    pd2_masks.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = time.perf_counter()
        plan = recipe.plan()
        ms = (time.perf_counter() - t) * 1e3
    return ms, plan, [str(w.message) for w in caught]


def _median_us(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--episodes", type=int, default=10_000, help="episodes per table")
    args = ap.parse_args()

    rows = []
    for components, batch_size, world in [(2, 64, 1), (6, 64, 1), (6, 64, 8), (6, 256, 1)]:
        recipe, tables = _recipe(components, batch_size, args.episodes)
        t = time.perf_counter()
        plan = recipe.plan()
        setup_ms = (time.perf_counter() - t) * 1e3
        step0 = _median_us(lambda p=plan, w=world: p.batch(0, 0, w), args.repeat)
        far = _median_us(lambda p=plan, w=world: p.batch(10**12, w - 1, w), args.repeat)
        text = plan.record.to_json()
        client = _Client(tables)

        def resume(text=text, client=client, world=world):
            p = Plan.from_record(RunRecord.from_json(text), client)
            p.batch(10**12 + 17, 0, world)

        resume_ms = _median_us(resume, max(5, args.repeat // 20)) / 1e3
        n_steps = 2000
        t = time.perf_counter()
        for s in range(10**9, 10**9 + n_steps):
            plan.batch(s, 0, world)
        throughput = n_steps * (batch_size // world) / (time.perf_counter() - t)
        rows.append((components, batch_size, world, setup_ms, step0, far, throughput, resume_ms))

    head = (
        f"{'comps':>5} {'B':>4} {'W':>3} {'setup ms':>9} {'step 0 us':>10} {'step 1e12 us':>13} "
        f"{'samples/s':>11} {'resume ms':>10}"
    )
    print(f"plan benchmark: {args.episodes:,} episodes per table, median of {args.repeat}")
    print(head)
    print("-" * len(head))
    for c, b, w, setup, s0, far, thr, res in rows:
        print(
            f"{c:>5} {b:>4} {w:>3} {setup:>9.2f} {s0:>10.1f} {far:>13.1f} {thr:>11,.0f} {res:>10.2f}"
        )
    print(
        "(per-batch times are for one rank's share: B/W samples; resume = parse record, "
        "rebuild plan, plan one batch at step 1e12+17)"
    )
    print("\nbuilding a plan (schedule memo cleared): 16 components")
    head = (
        f"{'weights':>8} {'B':>4} {'denominator':>12} {'period':>9} {'build ms':>9} {'1e12 us':>8}"
    )
    print(head)
    print("-" * len(head))
    for kind, batch_size in [("random", 64), ("random", 1), ("1e6", 63), ("1e6", 1)]:
        ms, plan = build_ms(16, batch_size, kind)
        far = _median_us(lambda p=plan: p.batch(10**12), args.repeat)
        sched = plan.schedule
        print(
            f"{kind:>8} {batch_size:>4} {sched.denominator:>12,} {sched.period:>9,} "
            f"{ms:>9.0f} {far:>8.1f}"
        )
    ms, plan = build_ms(16, 63, "1e6", stages=3)
    far = _median_us(lambda p=plan: p.batch(10**12), args.repeat)
    print(f"{'1e6 x3':>8} {63:>4} {'3 stages':>12} {'':>9} {ms:>9.0f} {far:>8.1f}")
    _oxe_rows(args.repeat)


def _oxe_rows(repeat: int) -> None:
    print('\nbuilding a plan: 26 OXE-sized tables (3,970 to 27M moments), weigh_by="moments"')
    head = f"{'chunk':>5} {'B':>5} {'denominator':>12} {'period':>9} {'build ms':>9} {'1e12 us':>8}"
    print(head + "  warning")
    print("-" * len(head))
    for chunk, batch_size in [(1, 256), (8, 256), (8, 64), (8, 1024)]:
        ms, plan, caught = oxe_build_ms(batch_size, chunk)
        far = _median_us(lambda p=plan: p.batch(10**12), repeat)
        sched = plan.schedule
        line = f"{chunk:>5} {batch_size:>5} {sched.denominator:>12,} {sched.period:>9,} "
        print(
            line
            + f"{ms:>9.0f} {far:>8.1f}  {len(caught)} x {max(map(len, caught), default=0)} chars"
        )


if __name__ == "__main__":
    main()
