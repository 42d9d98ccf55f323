"""The guide's examples say what they print (``print(x)  # 4 220 10.0``): check that they do.

tests/test_docs.py runs every block; this also compares each ``print(...)`` with the
comment beside it (or the comment lines right under it). The comparison is by the values
the comment names, in order: its numbers, ``True``/``False``/``None`` and quoted strings,
up to an explanation (``[6 2]: every batch ...``). ``...`` in a comment skips what it hides.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_docs import DOCS, PAGES, SLOW_PAGES, blocks  # noqa: E402

TOKEN = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?|\bTrue\b|\bFalse\b|\bNone\b|'[^']*'")
EXPLANATION = re.compile(r"(?<=[\]\)\}\w'])\s*:\s+(?=[a-z(])")


HEX_ID = re.compile(r"\b[0-9a-f]{8,64}\b")  # commit ids, run ids: they differ every run


def tokens(text: str) -> list[str]:
    """The values ``text`` holds, commit and run ids left out."""
    return TOKEN.findall(HEX_ID.sub(" ", text))


def expected_tokens(comment: str) -> list[str]:
    """The values a comment claims, before any ``: explanation``."""
    claim = EXPLANATION.split(comment, maxsplit=1)[0]
    return tokens(claim.replace("'...'", "'*'").replace("...", " "))


def printed_claims(code: str) -> dict[int, str]:
    """``{line of a print call: the comment that says what it prints}``."""
    lines = code.splitlines()
    claims = {}
    for node in ast.walk(ast.parse(code)):
        call = node.value if isinstance(node, ast.Expr) else None
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "print"):
            continue
        end = call.end_lineno
        _, hash_, inline = lines[end - 1].partition("  # ")
        comment = inline if hash_ else ""
        below = end
        while not comment and below < len(lines) and lines[below].lstrip().startswith("# "):
            comment += " " + lines[below].lstrip()[2:]
            below += 1
        if comment.strip():
            claims[call.lineno] = comment.strip()
    return claims


def is_subsequence(want: list[str], got: list[str]) -> bool:
    it = iter(got)
    return all(any(_same(w, g) for g in it) for w in want)


def _same(want: str, got: str) -> bool:
    return want == got or (want == "'*'" and got[:1] == "'") or _same_number(want, got)


def _same_number(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def check_page(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run the page like test_docs does; return the prints that differ from their comment."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("TREADLE_ROOT", str(tmp_path / "store"))
    monkeypatch.chdir(work)
    scope: dict = {"__name__": "__docs__"}
    wrong = []
    for n, (info, code) in enumerate(blocks(path, "python")):
        if "no-run" in info.split():
            continue
        name = f"{path.name} (python block {n + 1})"
        claims = printed_claims(code)
        seen: dict[int, str] = {}

        def record(*values, sep=" ", end="\n", file=None, flush=False, _seen=seen, _name=name):
            frame = sys._getframe(1)
            if frame.f_code.co_filename == _name:
                _seen[frame.f_lineno] = sep.join(map(str, values))

        scope["print"] = record
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, name, "exec"), scope)
        for line, comment in claims.items():
            got = seen.get(line)
            want = expected_tokens(comment)
            if got is None or not is_subsequence(want, tokens(got)):
                wrong.append(f"{name} line {line}: says {comment!r}, printed {got!r}")
    return wrong


def test_the_comparison_catches_a_wrong_claim():
    assert is_subsequence(expected_tokens("4 220 10.0"), TOKEN.findall("4 220 10.0"))
    assert not is_subsequence(expected_tokens("4 221 10.0"), TOKEN.findall("4 220 10.0"))
    assert expected_tokens("[6 2]: every batch holds 0.75*8") == ["6", "2"]
    assert expected_tokens("{'arm': [1, 2]}: every commit") == ["'arm'", "1", "2"]
    assert is_subsequence(["16", "7"], tokens("torch.Size([16, 7])"))
    assert is_subsequence(expected_tokens("{'tag': '...'}"), tokens("{'tag': 'fe1cae0541'}"))
    assert expected_tokens("9f87e5cf append to arm {'arm': 9}") == ["'arm'", "9"]


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, marks=[pytest.mark.slow] if p in SLOW_PAGES else [])
        for p in [*PAGES, "../README.md"]
        if blocks(DOCS / p, "python")
    ],
)
def test_examples_print_what_their_comments_say(page, tmp_path, monkeypatch):
    from importer_fixtures import set_up_page

    set_up_page(page)  # as test_docs does: a page importing torchvision needs its op schemas
    wrong = check_page(DOCS / page, tmp_path, monkeypatch)
    assert not wrong, "\n".join(wrong)


def test_the_cli_page_shows_the_error_treadle_prints(tmp_path, capsys):
    # before: the page showed "...; projects: robotics", treadle says "did you mean 'robotics'?"
    import numpy as np

    import treadle as td
    from treadle.cli import main

    text = (DOCS / "cli.md").read_text()
    shown = re.search(r"`(treadle: error: project 'robtics'[^`]*)`", text).group(1)
    root = tmp_path / "store"
    root.mkdir()
    arm = td.Client(str(root)).project("robotics").branch("main").table("arm")
    arm.append_episode({"action": np.zeros((3, 2), np.float32)}, episode="e")
    assert main(["--root", str(root), "log", "robtics"]) == 1
    printed = capsys.readouterr().err.strip()
    assert printed == shown.replace("/data/store", str(root))


def test_architecture_page_points_into_the_repository():
    # before: "Public API is named in `../shared/DESIGN.md` (a sibling of the checkout)",
    # a file a clone does not have (test_docs checks the guide's pages, not this one)
    from test_docs import test_links_point_into_the_repository

    text = (DOCS / "ARCHITECTURE.md").read_text()
    assert "DESIGN.md" not in text and "shared/" not in text
    test_links_point_into_the_repository("ARCHITECTURE.md")


def test_reimport_is_a_no_op_only_with_the_same_options(tmp_path):
    # the pages said "running the same import again is a no-op"; with other options
    # (here allow_pickle=True, for shards that hold no pickles) the same shards are a new
    # import, and their rows land twice
    import treadle as td
    from importer_fixtures import make_wds

    pattern = make_wds(tmp_path / "wds", n=4, per_shard=4)
    client = td.Client(str(tmp_path / "store"), create=True)
    first = td.importers.webdataset(pattern, "p", "t", client=client, progress=False)
    again = td.importers.webdataset(pattern, "p", "t", client=client, progress=False)
    other = td.importers.webdataset(
        pattern, "p", "t", client=client, progress=False, allow_pickle=True
    )
    assert (first.skipped, again.skipped, other.skipped) == (False, True, False)
    assert client.project("p").branch("main").table("t").num_moments == 8
    assert "other options are a new import" in (DOCS / "cli.md").read_text()
