"""The PD2 seat tables: pinned bit for bit, and the chunked simulation (plan/pd2.py) equal to
the step-by-step one (plan/pd2_serial.py), its tables and its re-runs included."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

import treadle.plan.pd2 as pd2
import treadle.plan.schedule as schedule_module
from treadle.errors import PlanError
from treadle.plan import pd2_serial
from treadle.plan.schedule import Schedule

# (numerators, denominator, batch size, period, sha256 of the seat table), computed with the
# step-by-step simulation before the chunked one existed. Every run record's batches follow
# from these tables: a change here changes the batches of existing runs (checkpoints resume on
# them), so a faster simulation must leave every hash as it is.
PINNED = {
    "bench_1e6_b63": (
        [
            16529,
            24446,
            34266,
            100027,
            94517,
            38043,
            195798,
            7504,
            95505,
            30318,
            12460,
            163853,
            37346,
            62140,
            57990,
            29258,
        ],
        1000000,
        63,
        1000000,
        "15164538e1fe2aec960d1d231d7a552b9cf4e6f37188a5cafd856accdd7659ad",
    ),
    "three_b92": (
        [140892, 455962, 403146],
        1000000,
        92,
        125000,
        "0c106da5c8e1bf2afb2856487779488cebcb201ad30f1f8d4c7562ed0aa86a4e",
    ),
    "twenty_b47": (
        [
            37471,
            21828,
            29696,
            7039,
            81264,
            45230,
            41277,
            59300,
            55492,
            256782,
            899,
            65986,
            69457,
            76538,
            27826,
            14214,
            5012,
            9725,
            88834,
            6130,
        ],
        1000000,
        47,
        1000000,
        "5320cc4bd9fbebeef582022e37bca96bda870715ed1de35f5d24b48779af2ca9",
    ),
    "sixty_four_b201": (
        [
            13808,
            2075,
            16636,
            12349,
            22274,
            1570,
            68047,
            21174,
            1055,
            8155,
            33916,
            42129,
            2526,
            3810,
            22429,
            10567,
            33383,
            72024,
            18511,
            2441,
            5271,
            2276,
            31248,
            44352,
            1082,
            2606,
            1368,
            2411,
            49103,
            18657,
            3413,
            5665,
            1209,
            31528,
            10745,
            1617,
            2211,
            9616,
            1761,
            21098,
            9584,
            4412,
            33914,
            44794,
            3165,
            1757,
            23517,
            17804,
            19927,
            2980,
            8423,
            37184,
            13517,
            1056,
            24698,
            4724,
            2640,
            11291,
            31463,
            7472,
            4417,
            987,
            4967,
            29191,
        ],
        1000000,
        201,
        1000000,
        "52478e5569c9e8f98acb9fac02a02309bfaa649adf399304fbe335ac3d18554c",
    ),
    "tiny_b88": (
        [30, 1, 1, 1, 10, 1, 2, 1, 1, 30, 438486, 73249, 488187],
        1000000,
        88,
        125000,
        "aacf1c0c432cf2dfe7f071f40b3890b27b0f956680e456c344a972b1341e6179",
    ),
    "group_deadlines": (
        [858, 36, 51, 24, 31],
        1000,
        155,
        200,
        "52f4f607936b8d7bff244aeac44cc7a31eb085f8b7b01c9179f0c876c6d6c865",
    ),
    "zero_and_65": (
        [
            0,
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            8,
            9,
            10,
            11,
            12,
            13,
            14,
            15,
            16,
            17,
            18,
            19,
            20,
            21,
            22,
            23,
            24,
            25,
            26,
            27,
            28,
            29,
            30,
            31,
            32,
            33,
            34,
            35,
            36,
            37,
            38,
            39,
            40,
            41,
            42,
            43,
            44,
            45,
            46,
            47,
            48,
            49,
            50,
            51,
            52,
            53,
            54,
            55,
            56,
            57,
            58,
            59,
            60,
            61,
            62,
            63,
            64,
        ],
        2080,
        37,
        2080,
        "edb0bf914a1943c84d2c79f95ca2f0cd0541cdb39283076489531b19c049bb7e",
    ),
}


def _digest(masks: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(masks).tobytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(PINNED))
def test_seat_tables_are_pinned(name):
    numerators, denominator, batch_size, period, digest = PINNED[name]
    schedule_module.pd2_masks.cache_clear()
    schedule = Schedule(numerators, denominator, batch_size)
    assert schedule.period == period
    assert pd2.fits(schedule.rates, period) == (period >= pd2.MIN_PERIOD and len(numerators) <= 64)
    assert _digest(schedule._masks) == digest


def _rates(numerators, denominator, batch_size):
    raw = [n * batch_size % denominator for n in numerators]
    g = math.gcd(denominator, *raw)
    return tuple(r // g for r in raw), denominator // g


def test_tiny_weights_make_chunks_that_are_re_run_step_by_step():
    """The pinned "tiny_b88" mix goes through the re-runs: its tiny shares keep a chunk's
    guessed start from meeting the true path within the warm-up."""
    numerators, denominator, batch_size, period, _ = PINNED["tiny_b88"]
    rates, p = _rates(numerators, denominator, batch_size)
    tables = pd2.Tables(rates, p)
    _, starts, first = pd2.run_chunks(tables, pd2.chunk_steps(p))
    out = pd2.simulate(tables)
    assert np.count_nonzero(first[1:] != out[starts[1:]]) > 10


def _random_rates(rng, m, p):
    """``m`` rates over ``p`` summing to whole seats, some zero, some equal, some tiny."""
    rates = rng.integers(0, p, size=m)
    rates[rng.random(m) < 0.1] = 0
    rates[rng.random(m) < 0.2] = rng.integers(1, 4)
    if m > 3:
        rates[1] = rates[2]
    rates[0] = 0
    rates[0] = (-int(rates.sum())) % p
    return tuple(int(a) for a in rates)


@pytest.mark.parametrize("seed", range(12))
def test_chunks_equal_the_step_by_step_simulation(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 65))
    p = int(rng.integers(3000, 9000))
    rates = _random_rates(rng, m, p)
    ref = pd2_serial.simulate(rates, p)[:, 0]
    assert np.array_equal(pd2.simulate(pd2.Tables(rates, p)), ref)
    # a useless guess: most chunks start wrong and are re-run, with the same result
    monkeypatch.setattr(pd2, "guess", lambda tables, t: np.zeros(t.size, dtype=np.uint64))
    assert np.array_equal(pd2.simulate(pd2.Tables(rates, p)), ref)


@pytest.mark.parametrize("seed", range(6))
def test_tables_equal_the_step_by_step_ones(seed):
    rng = np.random.default_rng(100 + seed)
    m, p = int(rng.integers(2, 65)), int(rng.integers(2, 5000))
    rates = _random_rates(rng, m, p)
    tables = pd2.Tables(rates, p)
    jumps, whole, need = pd2_serial.step_flags(np.asarray(rates, dtype=np.int64), p, 0, p, 1)
    assert np.array_equal(tables.jumps, jumps[:, 0])
    assert np.array_equal(tables.whole, whole[:, 0])
    assert np.array_equal(tables.need, need)


def test_setup_verification_catches_a_corrupt_chunked_schedule(monkeypatch):
    numerators, denominator, batch_size, _, _ = PINNED["three_b92"]
    real = pd2.simulate

    def bad(tables):
        out = real(tables)
        out[1000] ^= np.uint64(1)
        return out

    schedule_module.pd2_masks.cache_clear()
    monkeypatch.setattr(pd2, "simulate", bad)
    with pytest.raises(PlanError, match="internal"):
        Schedule(numerators, denominator, batch_size)
    schedule_module.pd2_masks.cache_clear()
