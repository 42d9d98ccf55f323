"""The guide in docs/ runs as written.

Every ```python block of a page runs, in order, in one namespace, with ``TREADLE_ROOT``
set to a fresh store and the working directory a fresh folder (so the examples write their
own small data there). A block marked ```python no-run is shown, never run: keep those rare.
Every `treadle ...` line of a ```sh / ```bash / ```console block parses with the real
command-line parser, and every relative link points at a file of the repository.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
DOCS = REPO / "docs"
# ARCHITECTURE.md is the maintainers' page (module contracts, signatures): not part of the guide.
PAGES = sorted(p.name for p in DOCS.glob("*.md") if p.name != "ARCHITECTURE.md")
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(path: Path, *langs: str) -> list[tuple[str, str]]:
    """``(info, code)`` of every fenced block of ``path`` whose language is one of ``langs``."""
    out = []
    for info, code in FENCE.findall(path.read_text()):
        words = info.split()
        if words and words[0] in langs:
            out.append((info, code))
    return out


def run_page(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Run every runnable ```python block of ``path`` in sequence; return the namespace."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("TREADLE_ROOT", str(tmp_path / "store"))
    monkeypatch.chdir(work)
    scope: dict = {"__name__": "__docs__"}
    ran = 0
    for n, (info, code) in enumerate(blocks(path, "python")):
        if "no-run" in info.split():
            continue
        exec(compile(code, f"{path.name} (python block {n + 1})", "exec"), scope)
        ran += 1
    scope["__blocks_run__"] = ran
    return scope


def command_lines(path: Path) -> list[list[str]]:
    """The `treadle ...` lines of the shell blocks of ``path``, split into words."""
    out = []
    for _, code in blocks(path, "sh", "bash", "console", "shell"):
        for line in code.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            words = shlex.split(line, comments=True)
            if words and words[0] == "treadle":
                out.append(words)
    return out


def parse_line(words: list[str]) -> None:
    """Parse ``words`` (a `treadle ...` line) like the CLI does; fail on a usage error."""
    from treadle.cli import build_parser

    parser = build_parser()
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()) as err,
    ):
        try:
            args = parser.parse_args(words[1:])
        except SystemExit as e:  # --help and --version exit 0; anything else is a usage error
            assert e.code == 0 and {"--help", "-h", "--version"} & set(words), (
                f"`{shlex.join(words)}` does not parse: {err.getvalue().strip()}"
            )
            return
    assert getattr(args, "func", None) is not None, f"`{shlex.join(words)}` names no command"


def test_the_guide_has_its_pages():
    want = {"README.md", "concepts.md", "storage.md", "api.md", "cli.md"}
    want |= {f"from-{x}.md" for x in ("lerobot", "mosaicml", "webdataset", "hf")}
    want |= {f"training-{x}.md" for x in ("lerobot", "lightning", "accelerate", "torchrun")}
    assert want <= set(PAGES)
    index = (DOCS / "README.md").read_text()
    for page in sorted(want - {"README.md"}) + ["ARCHITECTURE.md"]:
        assert f"({page})" in index, f"docs/README.md does not link {page}"


# `import streaming` alone takes 10-20 s here (it imports torchvision): that page is slow;
# so are `import lightning` and `import lerobot.processor` (torchvision too), and all need
# its op schemas on CPU torch.
SLOW_PAGES = {
    "from-mosaicml.md",
    "from-lerobot.md",
    "training-lightning.md",
    "training-accelerate.md",
}


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, marks=[pytest.mark.slow] if p in SLOW_PAGES else [])
        for p in PAGES
        if blocks(DOCS / p, "python")
    ],
)
def test_page_examples_run(page, tmp_path, monkeypatch):
    from importer_fixtures import set_up_page

    set_up_page(page)  # CPU torch beside PyPI's CUDA torchvision: see importer_fixtures
    scope = run_page(DOCS / page, tmp_path, monkeypatch)
    assert scope["__blocks_run__"] >= 1
    check = PAGE_CHECKS.get(page)
    if check is not None:
        check(scope)


def test_no_run_blocks_are_rare():
    marked = [(p, i) for p in PAGES for i, _ in blocks(DOCS / p, "python") if "no-run" in i]
    total = sum(len(blocks(DOCS / p, "python")) for p in PAGES)
    assert len(marked) <= max(2, total // 10), marked


@pytest.mark.parametrize("page", PAGES + ["../README.md"])
def test_command_lines_parse(page):
    for words in command_lines(DOCS / page):
        parse_line(words)


def test_cli_page_shows_every_command():
    from treadle.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    shown = {words[1] for words in command_lines(DOCS / "cli.md") if len(words) > 1}
    shown |= {w for words in command_lines(DOCS / "cli.md") for w in words[1:3]}
    assert set(sub.choices) <= shown, set(sub.choices) - shown
    text = (DOCS / "cli.md").read_text()
    for fmt in ("webdataset", "mds", "lerobot", "hf"):
        assert f"treadle import {fmt}" in text
    for option in ("--root", "--storage-option", "--config", "--quiet", "--json", "--version"):
        assert option in text


def test_api_page_names_every_public_name():
    import treadle as td
    import treadle.importers as importers
    import treadle.torch as tt
    from treadle import transforms

    text = (DOCS / "api.md").read_text()
    headings = "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))
    names = [f"td.{n}" for n in td.__all__ if n not in ("importers", "__version__")]
    names += [f"td.importers.{n}" for n in importers.__all__]
    names += [f"treadle.torch.{n}" for n in tt.__all__]
    names += [f"tf.{n}" for n in transforms.__all__]
    from treadle import lerobot

    names += [f"tl.{n}" for n in lerobot.__all__]
    missing = [n for n in names if n.split(".")[-1] not in headings]
    assert not missing, f"docs/api.md has no heading for {missing}"
    assert "td.__version__" in text


@pytest.mark.parametrize("page", PAGES + ["../README.md"])
def test_links_point_into_the_repository(page):
    path = DOCS / page
    text = path.read_text()
    assert "shared folder" not in text and "../shared" not in text
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        name, _, anchor = target.partition("#")
        file = (path.parent / name).resolve()
        assert file.exists() and REPO in file.parents, (
            f"{page} links {target}, not in the repository"
        )
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{page} links {target}: no such heading"


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of ``path`` (lower case, punctuation dropped)."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_docs_import_only_public_paths():
    """Other modules move (issue 14): the docs import only `treadle`, `treadle.torch`,
    `treadle.importers` and `treadle.transforms`, never an internal module."""
    public = {"treadle", "treadle.torch", "treadle.importers", "treadle.transforms"}
    public.add("treadle.testing")  # SeaweedS3: a local S3 server for the storage example
    for page in PAGES + ["../README.md"]:
        for _, code in blocks(DOCS / page, "python"):
            for mod in re.findall(r"^\s*(?:from|import)\s+(treadle[\w.]*)", code, re.M):
                assert mod in public, f"{page} imports internal module {mod}"


# -- what some pages' examples must have shown (beyond running without an error) -------------


def _check_concepts(scope: dict) -> None:
    assert scope["plan"].run_id == scope["again"].run_id
    assert scope["after"].run_id != scope["plan"].run_id
    assert scope["plan"].table(0).num_episodes == 4 and scope["after"].table(0).num_episodes == 5


def _check_storage(scope: dict) -> None:
    import treadle as td

    assert isinstance(scope["error"], td.ExpiredCommit)
    assert scope["report"].expired_commits == [scope["b"].id]


def _check_api(scope: dict) -> None:
    assert scope["resumed_moments"] == scope["uninterrupted_moments"]


def _check_importer(scope: dict) -> None:
    assert scope["result"].rows > 0 and scope["batch"]["_moment"].shape[0] > 0


PAGE_CHECKS = {
    "concepts.md": _check_concepts,
    "storage.md": _check_storage,
    "api.md": _check_api,
    "from-webdataset.md": _check_importer,
    "from-mosaicml.md": _check_importer,
    "from-hf.md": _check_importer,
    "from-lerobot.md": _check_importer,
}
