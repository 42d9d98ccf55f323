"""A new user's tryout of block shuffles, the lookahead, ``treadle simulate`` and image
columns: each test failed before its fix."""

from __future__ import annotations

import pytest

from treadle.cli import main

_SIM = ["simulate", "synthetic:oxe", "--nodes", "2", "--ranks-per-node", "2", "--cache-bytes",
        "4T", "--bandwidth", "3G", "--latency", "30ms", "--steps", "3", "--sample-nodes", "1",
        "--batch-per-rank", "2"]  # fmt: skip


@pytest.mark.parametrize("rate", ["-5", "0", "nan", "inf"])
def test_simulate_refuses_a_rank_rate_that_is_not_positive(rate, capsys):
    with pytest.raises(SystemExit):  # it printed negative and nan samples/s and GET/s
        main([*_SIM, f"--rank-rate={rate}"])
    assert "--rank-rate" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--block-rows", "64"], ["--partitions", "4"],
                                  ["--window-blocks", "2"]])  # fmt: skip
def test_simulate_refuses_block_options_without_shuffle_block(flag, capsys):
    assert main([*_SIM, *flag]) == 1  # they were ignored: a full permutation was walked
    err = capsys.readouterr().err
    assert flag[0] in err and "--shuffle block" in err


def test_simulate_refuses_a_run_shorter_than_its_windows(capsys):
    assert main([*_SIM, "--windows", "3", "--run-steps", "2"]) == 1  # walked 0..2 three times
    assert "--run-steps 2" in capsys.readouterr().err
