"""treadle simulate: chunk caches replayed over a plan (Belady's optimum, LRU), requests, CLI."""

from __future__ import annotations

import random

import numpy as np
import pytest

import treadle as td
from treadle.cli import main
from treadle.plan.simcache import NEVER as NEVER_
from treadle.plan.simcache import belady, lookahead, lru, requests
from treadle.plan.simulate import CHUNK_BITS, Link, Setup, simulate
from treadle.plan.synthetic import StandInTable


def _brute_force_hits(seq: list[int], capacity: int) -> int:
    """The most hits any eviction policy gets (every choice tried), one chunk per step; a
    step's chunk must be fetched, then any chunk (it too) may be evicted."""
    best = 0

    def go(i: int, cache: frozenset[int], hits: int) -> None:
        nonlocal best
        if i == len(seq):
            best = max(best, hits)
            return
        c = seq[i]
        if c in cache:
            go(i + 1, cache, hits + 1)
            return
        new = cache | {c}
        if len(new) <= capacity:
            go(i + 1, new, hits)
            return
        for out in new:  # the new chunk too: it was used by its step and may go at once
            go(i + 1, new - {out}, hits)

    go(0, frozenset(), 0)
    return best


def test_belady_is_the_optimum_and_never_below_lru():
    rng = random.Random(5)
    for _ in range(120):
        seq = [rng.randrange(5) for _ in range(rng.randrange(4, 11))]
        cap = rng.randrange(1, 4)
        steps = [np.asarray([c], np.int64) for c in seq]
        best = belady(steps, cap)
        assert best.hits == _brute_force_hits(seq, cap)
        assert best.hits >= lru(steps, cap).hits
        assert sum(m.size for m in best.misses) == len(seq) - best.hits


def test_belady_with_sets_per_step_keeps_what_comes_back():
    steps = [np.asarray(s, np.int64) for s in ([1, 2], [3, 4], [1, 2], [3, 4], [1, 2])]
    assert belady(steps, 4).hits == 6  # everything fits
    # LRU thrashes; the optimum keeps {1, 2} and streams {3, 4} through
    assert belady(steps, 2).hits == 4 and lru(steps, 2).hits == 0


def test_requests_merge_consecutive_chunks_of_one_object():
    o0, o1 = 0 << CHUNK_BITS, 1 << CHUNK_BITS
    ids = np.asarray([o0 + 1, o0 + 2, o0 + 3, o0 + 5, o1 + 0, o1 + 1], np.int64)
    assert requests(ids, CHUNK_BITS) == 3
    assert requests(np.asarray([o0 + (1 << CHUNK_BITS) - 1, o1], np.int64), CHUNK_BITS) == 2
    assert requests(np.empty(0, np.int64), CHUNK_BITS) == 0


@pytest.fixture(scope="module")
def small():
    a = StandInTable("a", np.full(20, 50), bytes_per_row=100, rows_per_object=400)
    b = StandInTable("b", np.full(10, 30), bytes_per_row=1000, rows_per_object=100)
    comps = [td.Component(a, weight=0.75), td.Component(b, weight=0.25)]
    return td.Recipe(3, 16, comps).plan()


def test_a_walk_counts_what_the_plan_reads(small):
    """One node, one row per chunk, a cache that holds everything, ranges never merged:
    fetched = distinct rows + what opening the tables reads, delivered = samples."""
    setup = Setup(1, 4, cache_bytes=1 << 30, chunk_bytes=100, sample_nodes=1, coalesce=-1)
    link = Link(bandwidth=1e9, latency=0.01, in_flight=8)
    steps = list(range(30))
    (rep,) = simulate(small, small.tables, setup, link, steps)
    rows = {(int(c), int(m)) for s in steps for c, m in zip(small.batch(s).component,
                                                            small.batch(s).moment)}  # fmt: skip
    want = sum(100 if c == 0 else 1000 for c, _ in rows)  # table b's rows are 10 chunks each
    assert sum(rep.fetched) - rep.open_bytes == want
    assert rep.open_bytes == 4 * (40_000 + 40_000 + 20_000 + 3 * 65_536)  # footers, 4 ranks
    assert rep.open_gets == 4 * (2 * 2 + 2 * 6)  # manifests, and a HEAD and a GET per footer
    assert rep.delivered == sum(
        100 * int((small.batch(s).component == 0).sum()) + 1000 * int((small.batch(s).component == 1).sum())
        for s in steps
    )  # fmt: skip
    per_step = [{(int(c), int(m)) for c, m in zip(small.batch(s).component,
                                                  small.batch(s).moment)} for s in steps]  # fmt: skip
    accesses = sum(1 if c == 0 else 10 for step in per_step for c, _ in step)
    assert rep.optimum == pytest.approx(1 - want / 100 / accesses)
    assert rep.samples == 16 * 30 and rep.gets[0] >= 2  # manifests of two tables, at least


def test_footers_are_read_as_their_data_files_are_first_needed(small):
    """A rank reads the footer of a data file (a HEAD and a GET) in the first round it needs
    a chunk of it, as the loader does: one step reads the files of its rows only."""
    setup = Setup(1, 4, cache_bytes=1 << 30, chunk_bytes=100, lookahead=0, sample_nodes=1)
    (rep,) = simulate(small, small.tables, setup, Link(1e9, 0.01), [0])
    batch, files = small.batch(0), 0
    for r in range(4):
        comp, moment = batch.component[r::4], batch.moment[r::4]
        files += len({(int(c), int(m) // (400 if c == 0 else 100)) for c, m in zip(comp, moment)})
    assert rep.open_gets == 4 * 2 * 2 + 2 * files < 4 * (2 * 2 + 2 * 6)


def test_more_nodes_fetch_more_for_the_same_batches(small):
    link = Link(bandwidth=1e9, latency=0.01)
    one = simulate(small, small.tables, Setup(1, 4, 1 << 30, 400, sample_nodes=1), link, range(40))
    four = simulate(small, small.tables, Setup(4, 1, 1 << 30, 400), link, range(40))
    assert sum(sum(r.fetched) for r in four) > sum(one[0].fetched)
    assert sum(r.delivered for r in four) == one[0].delivered


def test_cli_reports_and_refuses_a_batch_the_ranks_do_not_divide(capsys):
    argv = ["simulate", "synthetic:oxe", "--nodes", "2", "--ranks-per-node", "2",
            "--cache-bytes", "64G", "--bandwidth", "1G", "--latency", "30ms", "--steps", "3",
            "--batch-per-rank", "4", "--shuffle", "block", "--partitions", "4"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    for line in ("hit rate, Belady optimum", "GET/s", "time to first batch", "samples/s",
                 "partitions=4", "a block stays open"):  # fmt: skip
        assert line in out
    assert "opening GETs per rank" in out and "GETs per sample, steady" in out
    assert main([*argv, "--pages"]) == 1  # stand-ins have no footers to read
    assert "--pages reads Lance tables' footers" in capsys.readouterr().err
    bad = [a if a != "--batch-per-rank" else "--block-rows" for a in argv]  # batch 64
    bad[bad.index("--nodes") + 1] = "3"
    assert main(bad) == 1
    err = capsys.readouterr().err
    assert "batch size 64 is not divisible by 3 nodes x 2 ranks" in err
    # before: nothing said how to simulate that recipe at 6 ranks
    assert "give --batch-per-rank N (a global batch of N x 6)" in err


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [("--cache-bytes", "inf", "'inf' is not a size"),  # was an OverflowError traceback
     ("--bandwidth", "nan", "'nan' is not a size"),
     ("--latency", "1.2.3", "'1.2.3' is not a latency"),  # was "invalid _latency value"
     ("--latency", "1e400s", "'1e400s' is not a latency"),  # read as an infinite latency
     ("--latency", "30", "'30' is 30 seconds a request: write 30ms, or 30s"),  # was 30 s
     # was "expected one argument" (argparse took -5G for an option)
     ("--cache-bytes", "-5G", "'-5G' is negative: give a size of at least 1 byte"),
     ("--bandwidth", "-1.5M", "'-1.5M' is negative: give a size of at least 1 byte"),
     ("--cache-bytes", "-5", "'-5' is negative: give a size of at least 1 byte")],  # "not a size"
)  # fmt: skip
def test_cli_names_a_nonsense_size_or_latency_as_a_usage_error(capsys, flag, value, said):
    argv = ["simulate", "synthetic:oxe", "--nodes", "1", "--ranks-per-node", "1",
            "--cache-bytes", "64G", "--bandwidth", "1G", "--latency", "30ms"]  # fmt: skip
    argv[argv.index(flag) + 1] = value
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert f"argument {flag}: {said}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"), [("1e-3", 1e-3), ("3e-2s", 0.03), ("30ms", 0.03), ("2.5E1ms", 0.025)]
)
def test_a_latency_may_be_written_with_an_exponent(text, seconds):
    """``--latency 1e-3`` (a second's thousandth, as Python writes it) was refused as "not a
    latency"."""
    from treadle.cli.cmd_simulate import _latency

    assert _latency(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("sizes", [["--cache-bytes", "5"], ["--chunk-bytes", "2G"]])
def test_cli_refuses_a_cache_smaller_than_one_chunk(capsys, sizes):
    """A cache of 5 bytes was modelled as one 1 MiB chunk (Belady 80%, 0 for the loader's
    replay), where the loader's chunk store refuses a bound under one chunk."""
    argv = ["simulate", "synthetic:oxe", "--nodes", "1", "--ranks-per-node", "1",
            "--cache-bytes", "1G", "--bandwidth", "1G", "--latency", "30ms", "--steps", "2",
            *sizes]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "is less than one chunk" in err and "--chunk-bytes" in err and "--cache-bytes" in err


def test_cli_picks_the_chunk_size_a_loader_picks(capsys):
    """``--chunk-bytes`` defaulted to 1 MiB whatever the cache: a cache under 1 MiB was
    refused, where a loader with that bound picks smaller chunks (16 fit the bound)."""
    argv = ["simulate", "synthetic:oxe", "--nodes", "1", "--ranks-per-node", "1",
            "--cache-bytes", "512K", "--bandwidth", "1G", "--latency", "30ms", "--steps", "2"]  # fmt: skip
    assert main(argv) == 0
    assert "cache 512 KiB per node in 32 KiB chunks" in capsys.readouterr().out


def test_the_report_prints_sizes_in_the_binary_units_its_flags_take(capsys):
    """``--cache-bytes 2T --bandwidth 3G --chunk-bytes 4M`` (binary: 3G is 3 x 2**30) printed
    "cache 2.2 TB per node in 4.19 MB chunks · link 3.22 GB/s"."""
    from treadle.plan.simreport import size_text

    argv = ["simulate", "synthetic:oxe", "--nodes", "1", "--ranks-per-node", "1",
            "--cache-bytes", "2T", "--bandwidth", "3G", "--chunk-bytes", "4M",
            "--latency", "30ms", "--steps", "2"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "cache 2 TiB per node in 4 MiB chunks · lookahead 9 steps · link 3 GiB/s, 30 ms" in out
    assert " GB" not in out and " MB" not in out
    assert [size_text(n) for n in (512, 1536, 3 << 20, 1.5 * (1 << 30))] == [
        "512 B", "1.5 KiB", "3 MiB", "1.5 GiB",
    ]  # fmt: skip


def test_cli_refuses_json_it_would_ignore(capsys):
    """simulate prints a report, not data: ``--json`` printed the text with exit code 0."""
    argv = ["simulate", "synthetic:oxe", "--nodes", "1", "--ranks-per-node", "1",
            "--cache-bytes", "64G", "--bandwidth", "1G", "--latency", "30ms", "--json"]  # fmt: skip
    assert main(argv) == 2
    assert "--json: simulate does not use it" in capsys.readouterr().err


def test_prefix_warning_past_the_s3_limit(capsys):
    argv = ["simulate", "synthetic:oxe", "--nodes", "64", "--ranks-per-node", "1",
            "--cache-bytes", "1G", "--bandwidth", "100G", "--latency", "1ms", "--steps", "2",
            "--batch-per-rank", "8", "--shuffle", "full", "--chunk-bytes", "128K",
            "--sample-nodes", "1"]  # fmt: skip
    assert main(argv) == 0
    assert "past the ~5,500 GET/s an S3 prefix serves" in capsys.readouterr().out


def test_brute_force_reference_is_itself_right():
    assert _brute_force_hits([1, 2, 1, 3, 1, 2], 2) == 3  # keep 1 and 2, stream 3 through
    assert _brute_force_hits([1, 2, 3, 1, 2, 3], 3) == 3
    assert _brute_force_hits([2, 4, 0, 1, 0, 1], 1) == 1  # 1 kept past the second 0


def test_a_toml_recipe_names_its_shuffle_and_simulates(tmp_path, capsys):
    client = td.Client(str(tmp_path / "root"), create=True)
    arm = client.project("robotics").branch("main").table("arm")
    for i in range(4):
        arm.append_episode({"action": np.zeros((30, 7), np.float32)}, episode=f"e{i}")
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        'project = "robotics"\nseed = 1\nbatch_size = 8\n[[components]]\ntable = "arm"\n'
        "[shuffle]\nblock_rows = 16\npartitions = 4\n"
    )
    root = ["--root", str(tmp_path / "root")]
    assert main(["plan", str(recipe), *root]) == 0
    assert (
        "treadle.block/1, blocks of 16 rows, at most 4 open at once per partition of a component, "
        "4 partitions" in (capsys.readouterr().out)
    )
    argv = ["simulate", str(recipe), *root, "--nodes", "2", "--ranks-per-node", "2",
            "--cache-bytes", "1M", "--bandwidth", "1G", "--latency", "1ms", "--steps", "20"]  # fmt: skip
    assert main(argv) == 0
    assert "partitions=4" in capsys.readouterr().out
    recipe.write_text(recipe.read_text().replace("partitions", "parts"))
    assert main(["plan", str(recipe), *root]) == 1
    assert "'shuffle' must be a table of" in capsys.readouterr().err


def test_obstore_merges_ranges_closer_than_a_mebibyte():
    from treadle.storage.coalesce import OBSTORE_COALESCE, coalesced

    mib = OBSTORE_COALESCE
    ranges = [(5 * mib, 6 * mib), (0, 10), (10 + mib, 20 + mib), (20 + 2 * mib + 1, 3 * mib)]
    # gap of exactly 1 MiB merges; one byte more does not; order does not matter
    assert coalesced(ranges) == [(0, 20 + mib), (20 + 2 * mib + 1, 3 * mib), (5 * mib, 6 * mib)]
    assert coalesced([(0, 10), (5, 8), (10, 12)], gap=-1) == [(0, 10), (10, 12)]


def test_next_use_by_any_rank_of_the_node(small):
    """Ranks 2 and 3 of 4 share a node (2 per node): the node's samples at a step are theirs
    (as each rank's batch gives them), and a key's next use is the first later step at which
    either needs it, even when the rank asking needs it only later or never."""
    from treadle.errors import PlanError
    from treadle.plan.nextuse import NEVER, NodeNextUse, node_batch, node_ranks

    world, per_node, horizon = 4, 2, 6
    assert node_ranks(3, world, per_node) == range(2, 4)
    with pytest.raises(PlanError, match="divide the world size 4"):
        node_ranks(0, world, 3)
    comp, moment = node_batch(small, 5, 3, world, per_node)
    mine = [small.batch(5, rank=r, world_size=world) for r in (2, 3)]
    assert comp.tolist() == [int(c) for b in mine for c in b.component]
    assert moment.tolist() == [int(m) for b in mine for m in b.moment]

    def keys(c, m):  # a "chunk": 8 rows of one component
        return {(int(a), int(b) // 8) for a, b in zip(c, m)}

    def rank_keys(step, rank):
        b = small.batch(step, rank=rank, world_size=world)
        return keys(b.component, b.moment)

    nxt = NodeNextUse(small, 2, world, per_node, keys, horizon)
    crossed = 0
    for step in range(12):
        for key in rank_keys(step, 2) | rank_keys(step, 3):
            later = [s for s in range(step + 1, step + 1 + horizon)
                     if key in rank_keys(s, 2) | rank_keys(s, 3)]  # fmt: skip
            assert nxt.next_use(key, step) == (later[0] if later else NEVER)
            own = [s for s in range(step + 1, step + 1 + horizon) if key in rank_keys(s, 2)]
            crossed += bool(later) and (not own or own[0] > later[0])
    assert crossed > 0  # rank 2 alone would have placed these later (or never)


def test_next_uses_of_own_ranks_only_keep_less_than_the_nodes():
    """Chunk 1 is read by rank 0 at step 0 and next by rank 1 at step 2: rank 0 alone calls
    it never needed again, like chunk 3, and it goes when room is made at step 1 (ties go by
    chunk id); the node's next uses keep it. Over random steps, own ranks' next uses never
    beat the optimum."""
    from treadle.plan.simcache import rank_next_uses

    def a(*c):
        return np.asarray(c, np.int64)

    ranks = [[a(1), a(2)], [a(3), a()], [a(), a(1)], [a(), a(2)]]
    union = [np.unique(np.concatenate(s)) for s in ranks]
    assert [n.tolist() for n in rank_next_uses(ranks)][:2] == [[NEVER_, 3], [NEVER_]]
    assert belady(union, 2).hits == 2 and belady(union, 2, rank_next_uses(ranks)).hits == 1
    rng = random.Random(3)
    for _ in range(60):
        steps = [[a(*sorted(set(rng.sample(range(8), rng.randrange(0, 3))))) for _ in range(2)]
                 for _ in range(rng.randrange(3, 9))]  # fmt: skip
        union = [np.unique(np.concatenate(s)) for s in steps]
        cap = rng.randrange(1, 4)
        assert belady(union, cap, rank_next_uses(steps)).hits <= belady(union, cap).hits


def test_pages_count_video_windows_stream_chunks(tmp_path):
    """``--pages`` on a local video table: no row is read from chunks, the windows' stream
    ranges are (a request per stream chunk run, no footer for a stream), and the delivered
    bytes are the windows' ranges."""
    from treadle.cli.cmd_simulate import _pages
    from treadle.video._testing import synthetic_frames

    branch = td.Client(str(tmp_path / "root"), create=True).project("p").branch()
    with branch.transaction("e") as tx:
        for e in range(4):
            cams = {f"cam{k}": td.VideoFrames(synthetic_frames(20, 32, 32, seed=e + k), fps=10)
                    for k in range(2)}  # fmt: skip
            tx.table("v").append_episode(cams, episode=f"e{e}")
    windows = td.Windows({"cam0": td.Video([0, 1]), "cam1": td.Video([0, 1])})
    plan = td.Recipe(1, 8, [td.Component(branch.table("v"), windows)]).plan()
    setup = Setup(1, 2, 1 << 30, 1024, sample_nodes=1, read_ahead=8)
    layout, media = _pages(plan, setup, str(tmp_path / "chunks"))
    assert [tb.columns for tb in layout] == [[]]
    (rep,) = simulate(plan, plan.tables, setup, Link(1e9, 0.03), range(10), layout, media)
    assert rep.table_gets["v"] == rep.open_gets == 2 * 2  # the manifest, by each rank
    assert 0 < rep.table_gets["media"] and rep.delivered > 0
    streams = sum(f.stat().st_size for f in (tmp_path / "root").rglob("*.h264"))
    assert 0 < sum(rep.fetched) - rep.open_bytes <= streams  # each stream chunk at most once


def test_the_loaders_replay_holds_a_window_and_cannot_pass_the_optimum():
    """:func:`lookahead` replays the loader's stage: with room for every chunk it misses
    only first uses (the optimum); with room for one step's chunks, the step entering the
    window finds none (the steps before it hold theirs) and its misses are not kept."""
    steps = [np.asarray(s, np.int64) for s in ([1, 2], [3, 4], [1, 2], [3, 4], [1, 2])]
    full = lookahead(steps, 4, lambda c: 1, window=1)
    assert (full.hits, full.accesses, full.over) == (6, 10, 0)
    assert full.hit_rate == belady(steps, 4).hit_rate
    tight = lookahead(steps, 2, lambda c: 1, window=1)  # 3 and 4 never find room
    assert [m.tolist() for m in tight.misses] == [[1, 2], [3, 4], [], [3, 4], []]
    assert tight.over == 4 and tight.hit_rate <= belady(steps, 2).hit_rate


def test_the_loader_knows_next_uses_past_its_window():
    """After step 0, chunk 1 is needed again at step 3, past the window of steps 1..2;
    chunk 2 never. With uses known 64 steps ahead (the stage's horizon) the stage evicts 2
    for chunk 4 and hits 1 at step 3, as Belady does; knowing only its window, both look
    never needed and 1 goes first (the lower key)."""
    from treadle.read.lookahead import HORIZON_STEPS

    steps = [np.asarray(s, np.int64) for s in ([1, 2], [3], [3, 4], [1, 4])]
    window_only = lookahead(steps, 3, lambda c: 1, window=1, horizon=1)
    ahead = lookahead(steps, 3, lambda c: 1, window=1, horizon=HORIZON_STEPS)
    assert (window_only.hits, ahead.hits, belady(steps, 3).hits) == (2, 3, 3)
    assert ahead.misses[3].tolist() == [] and window_only.misses[3].tolist() == [1]


def test_a_block_read_within_a_step_is_not_said_to_stay_open_zero_steps(small):
    """Blocks of 4 rows, w=1, in batches of 64: the larger component (3/4 of each batch)
    uses a block in 4 / 48 of a step; the report printed "~0 steps" (512 GPUs, no partitions)."""
    from treadle.plan.simreport import render

    a, b = small.tables
    comps = [td.Component(a, weight=0.75), td.Component(b, weight=0.25)]
    plan = td.Recipe(3, 64, comps, shuffle=td.BlockShuffle(block_rows=4, window_blocks=1)).plan()
    setup, link = Setup(1, 1, 1 << 30, 400, sample_nodes=1), Link(1e9, 0.01)
    out = render(simulate(plan, plan.tables, setup, link, range(2)), plan, setup, link, "2")
    assert "a block stays open ~0.083 steps (largest component), 0.083 .. 0.25 over all" in out


def test_the_report_says_where_the_loaders_stage_gave_up(small, capsys):
    """A window of 3 steps of 10 new chunks each through room for 2: the stage gives up, as
    the loader does (more than half asked found no room, 64 asked at least); the report
    printed the hit rate of the steps before as the walk's, and said nothing."""
    steps = [np.arange(10, dtype=np.int64) + 10 * s for s in range(20)]
    rep = lookahead(steps, 2, lambda c: 1, window=2)
    assert rep.stopped == 6 and rep.accesses == 70  # rounds: steps 0..2, 3, 4, 5, 6
    assert lookahead(steps, 40, lambda c: 1, window=2).stopped is None

    from treadle.plan.simreport import render

    setup, link = Setup(1, 1, 200, 100, sample_nodes=1, read_ahead=2), Link(1e9, 0.01)
    reports = simulate(small, small.tables, setup, link, range(30))
    assert reports[0].loader_stopped is not None
    out = render(reports, small, setup, link, "30")
    assert f"the loader's lookahead stage gives up at step {reports[0].loader_stopped} of 30" in out


def test_a_chunk_that_finds_no_room_is_owed_and_fetched_later():
    """Step 2 enters the window (steps 0..2) while chunks 1 and 2, held for step 0, fill
    the cache: its chunk 3 is owed, and fetched in the round after step 0 is read (chunk 1
    goes), so step 3 finds it, as with Belady's optimum (before: not kept for step 2, and
    missed again by step 3). Steps the reader may be reading (``read_ahead``) are not asked
    for again: what they owe is missed."""
    steps = [np.asarray(s, np.int64) for s in ([1, 2], [], [3], [3])]
    got = lookahead(steps, 2, lambda c: 1, window=2)
    assert got.hits == belady(steps, 2).hits == 1
    assert [m.tolist() for m in got.misses] == [[1, 2], [], [3], []] and got.over == 0
    reading = lookahead(steps, 2, lambda c: 1, window=3, read_ahead=2)
    assert (reading.hits, reading.over) == (0, 2)


def test_sizes_of_1000_to_1023_units_print_without_an_exponent():
    # before: "peak in-flight bytes  1e+03 MiB" (format .3g of 1000.4)
    from treadle.plan.simreport import size_text

    assert size_text(1000.4 * (1 << 20)) == "1,000 MiB"
    assert size_text(1023.9 * (1 << 30)) == "1,024 GiB"
    assert size_text(999.4 * (1 << 20)) == "999 MiB"
    assert size_text(1.5 * (1 << 20)) == "1.5 MiB"
    assert size_text(5000 * (1 << 40)) == "5,000 TiB"


def test_cli_a_missing_required_option_is_a_usage_error(capsys):
    """A missing ``--ranks-per-node`` exited 1, one option at a time, though a missing
    argument is a usage error (exit 2), and the usage line showed every option as optional."""
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "synthetic:oxe", "--nodes", "2"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "required: --ranks-per-node, --cache-bytes, --bandwidth, --latency" in err
    assert "[--nodes NODES]" not in err and "--nodes NODES" in err
