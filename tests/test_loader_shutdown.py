"""A loader with worker processes closed early (``break``) ends its workers cleanly."""

from __future__ import annotations

import textwrap

import pytest

from script_helpers import run_script

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import treadle as td

    def main(root):
        rng = np.random.default_rng(0)
        branch = td.Client(root, create=True).project("robotics").branch()
        with branch.transaction("video") as tx:
            for e in range(2):
                frames = rng.integers(0, 255, (48, 96, 96, 3), dtype=np.uint8)
                tx.table("cams").append_episode(
                    {"cam": td.VideoFrames(frames, fps=30)}, episode=f"e{e}"
                )
        windows = td.Windows({"cam": td.Video(range(16))})
        recipe = td.Recipe(
            seed=1, batch_size=16, components=[td.Component(branch.table("cams"), windows)]
        )
        for attempt in range(3):
            loader = td.TrainLoader(recipe, steps=50, workers=2, prefetch=4)
            for n, batch in enumerate(loader):
                assert batch["cam"].shape == (16, 16, 96, 96, 3)
                if n == 1:
                    break
        print("done", flush=True)

    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


@pytest.mark.slow
def test_breaking_out_of_a_worker_loader_does_not_abort_its_workers(tmp_path):
    proc = run_script(tmp_path, SCRIPT, tmp_path / "root", name="early_break.py", timeout=300)
    assert "done" in proc.stdout
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]
    assert "killed by signal" not in proc.stderr, proc.stderr[-3000:]
