"""The trainers users keep, with the real libraries: torchrun/DDP (examples/ddp.py),
Accelerate (examples/accelerate_train.py), Lightning (examples/lightning_train.py), each at 1
and 2 processes on CPU (gloo)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
EX = REPO / "examples"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow  # each test starts processes


def _run(
    cmd: list[str], tmp: Path, ok: bool = True, timeout: int = 300
) -> subprocess.CompletedProcess:
    """``cmd`` with ``tmp`` as its temporary folder: torchrun made /tmp/torchelastic_* (its
    workers' log folder) and left it there."""
    (tmp / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp / "tmp")}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    if ok:
        assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-4000:])
    return out


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _torchrun(n: int) -> list[str]:
    return [str(BIN / "torchrun"), "--nproc_per_node", str(n), "--master_port", _free_port()]


def test_torchrun_ddp_train_and_eval_with_a_collective_per_batch(tmp_path):
    """73 eval moments, batch 8, 2 ranks: the ranks had 10 and 9 batches (the per-batch
    all_reduce hung); now both have 10 and the metric equals one process's."""
    root = str(tmp_path / "store")
    _run([sys.executable, str(EX / "ddp.py"), "--root", root, "--out", str(tmp_path / "1.json")],
         tmp_path)  # fmt: skip
    _run(_torchrun(2) + [str(EX / "ddp.py"), "--root", root, "--out", str(tmp_path / "2.json")],
         tmp_path, timeout=240)  # fmt: skip
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in (1, 2))
    assert (one["world"], two["world"]) == (1, 2)
    assert one["eval_samples"] == two["eval_samples"] == 73
    assert one["eval_mse"] == two["eval_mse"] > 0
    assert one["batches"] == two["batches"] and len(one["batches"]) == 6


def test_accelerate_two_processes_read_the_single_process_batches(tmp_path):
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("accelerate is not installed")
    root = str(tmp_path / "store")
    script = str(EX / "accelerate_train.py")
    _run([sys.executable, script, "--root", root, "--out", str(tmp_path / "one")], tmp_path)
    launch = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", _free_port()]  # fmt: skip
    out = _run(launch + [script, "--root", root, "--out", str(tmp_path / "two")], tmp_path)
    assert "prepare(TrainLoader) returns it unchanged" in out.stdout + out.stderr
    one = json.loads((tmp_path / "one" / "rank0.json").read_text())
    parts = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [p["world"] for p in parts] == [2, 2]
    for step, whole in enumerate(one["batches"]):
        halves = [p["batches"][step] for p in parts]
        assert sorted(halves[0] + halves[1]) == sorted(whole), step
        assert not set(halves[0]) & set(halves[1])


def _steps(path: Path) -> dict[int, list[int]]:
    """Step -> moments trained; a step trained again after a resume replaces the lost one."""
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out[r["step"]] = r["moments"]
    return out


def _plan_batches(root: str, rank: int, world: int) -> dict[int, list[int]]:
    """What an uninterrupted run trains (examples/lightning_train.py's recipe): the plan's
    batches, which TrainLoader delivers (tests/test_loader.py)."""
    import treadle as td

    arm = td.Client(root).project("pl").branch().table("arm")
    windows = td.Windows({"x": td.Rows([0]), "y": td.Rows([0])})
    plan = td.Recipe(seed=5, batch_size=8, components=[td.Component(arm, windows)]).plan()
    return {s: plan.batch(s, rank, world).moment.tolist() for s in range(10)}


@pytest.mark.parametrize("devices", [1, 2])
def test_lightning_resumes_mid_epoch_on_exactly_the_uninterrupted_batches(tmp_path, devices):
    """Killed after step 6 (os._exit), resumed from the step-4 checkpoint with ckpt_path=:
    steps 0-5 before the kill and 4-9 after are the uninterrupted run's batches."""
    if importlib.util.find_spec("lightning") is None:  # imported by the example only
        pytest.skip("lightning is not installed")
    root = str(tmp_path / "store")
    script = [sys.executable, str(EX / "lightning_train.py"), "--root", root,
              "--devices", str(devices), "--out", str(tmp_path / "cut")]  # fmt: skip
    killed = _run(script + ["--kill-at", "6"], tmp_path, ok=False)
    assert killed.returncode != 0  # os._exit(3) after step 6
    ckpts = sorted(p.name for p in (tmp_path / "cut" / "ckpt").glob("*.ckpt"))
    assert ckpts == ["epoch=0-step=4.ckpt"]
    before = {r: _steps(tmp_path / "cut" / f"rank{r}.jsonl") for r in range(devices)}
    _run(script + ["--resume"], tmp_path)
    for r in range(devices):
        want = _plan_batches(root, r, devices)
        assert before[r] == {s: want[s] for s in range(6)}
        lines = [
            json.loads(x) for x in (tmp_path / "cut" / f"rank{r}.jsonl").read_text().splitlines()
        ]
        after = {x["step"]: x["moments"] for x in lines[6:]}
        assert [x["step"] for x in lines[6:]] == list(range(4, 10))  # from the checkpoint on
        assert after == {s: want[s] for s in range(4, 10)}
