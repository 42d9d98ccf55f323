"""Recipes from files: ``RECIPE.toml`` or ``recipe.py`` (what ``treadle plan`` reads).

A TOML recipe::

    project = "robotics"
    branch = "main"              # default branch of every component (default "main")
    root = "s3://bucket/prefix"  # optional; else --root, else $TREADLE_ROOT or ~/.treadle
    seed = 2048
    batch_size = 64
    # weigh_by = "moments"       # optional: share ∝ weight × eligible moments

    [[components]]
    table = "failed_grasps"
    weight = 0.3                 # default 1.0
    # branch = "exp"             # optional: this component's branch
    # version = 12               # optional: pin this Lance version (or commit = "01a1a71d")
    [components.windows]
    wrist_camera = { kind = "video", range = [0, 90], size = [224, 224] }
    action = { kind = "rows", offsets = [0, 1, 2, 3] }

    [[components]]
    table = "nominal_grasps"
    weight = 0.7                 # no windows: every column at the moment itself
    # where = "success"          # optional: anchors whose own row satisfies this Lance SQL
    # episodes = ["ep-0001"]     # optional: anchors from these episodes only
    # rename = { cam = "wrist_camera" }   # optional: table column -> batch name

    [shuffle]                    # optional: td.BlockShuffle (absent: the full permutation)
    partitions = 64              # block_rows, window_blocks: default sized from the cache

A window is ``kind`` (``"video"`` or ``"rows"``) with ``range = [start, stop)``, ``offsets``
or ``seconds`` (with ``tolerance_s``), and ``pad = true`` for edge padding;
video windows also take ``size``, ``layout``, ``dtype``, ``mean``, ``std`` (see ``td.Video``).
Storage credentials come from ``--storage-option``, ``--config`` or the environment,
never from the recipe file.

A Python recipe is a file that defines ``recipe`` (a ``td.Recipe``, or a function returning one).
"""

from __future__ import annotations

import difflib
import runpy
import tomllib
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treadle.catalog import Client
from treadle.cli.args import read_root
from treadle.errors import PlanError, TreadleError
from treadle.plan.recipe import Component, Recipe
from treadle.plan.shuffle import BlockShuffle
from treadle.plan.windows import Spec, Windows, spec_from_json

if TYPE_CHECKING:
    from treadle.table.table import Table

_TOP = {"project", "branch", "root", "seed", "batch_size", "components", "weigh_by", "shuffle"}
_SHUFFLE = {"block_rows", "window_blocks", "partitions"}
_COMP = {"table", "weight", "branch", "version", "commit", "windows", "where", "episodes", "rename"}
_SPEC = {
    "kind",
    "range",
    "offsets",
    "size",
    "layout",
    "dtype",
    "mean",
    "std",
    "pad",
    "seconds",
    "tolerance_s",
}


def _unknown_key(what: str, keys: set[str], known: set[str]) -> PlanError:
    """``"<what> has unknown key 'offset'; did you mean 'offsets'? (known: [...])"``."""
    key = sorted(keys)[0]
    close = difflib.get_close_matches(key, sorted(known), n=2, cutoff=0.6)
    guess = "; did you mean " + " or ".join(map(repr, close)) + "?" if close else ""
    return PlanError(f"{what} has unknown key {key!r}{guess} (known: {sorted(known)})")


def _window_spec(col: str, value: Any, where: str) -> Spec:
    if not isinstance(value, dict):
        raise PlanError(f'{where}: window {col!r} must be a table like {{ kind = "video", ... }}')
    if set(value) - _SPEC:
        raise _unknown_key(f"{where}: window {col!r}", set(value) - _SPEC, _SPEC)
    spec = dict(value)
    if "range" in spec:
        if "offsets" in spec:
            raise PlanError(f"{where}: window {col!r} gives both range and offsets")
        spec["offsets"] = {"range": spec.pop("range")}
    if "seconds" in spec:
        if "offsets" in spec:
            raise PlanError(f"{where}: window {col!r} gives both seconds and offsets")
        spec["offsets"] = None
    if "offsets" not in spec:
        raise PlanError(f"{where}: window {col!r} needs range = [start, stop), offsets or seconds")
    if spec.get("kind") not in ("video", "rows"):
        got = f", not {spec['kind']!r}" if "kind" in spec else ""
        raise PlanError(f'{where}: window {col!r} needs kind = "video" or "rows"{got}')
    try:
        return spec_from_json(spec)
    except PlanError as e:
        raise PlanError(f"{where}: window {col!r}: {e}") from None


def recipe_from_toml(data: dict[str, Any], client: Any) -> Recipe:
    """Build a :class:`Recipe` from a parsed TOML recipe (format in the module docstring)."""
    if set(data) - _TOP:
        raise _unknown_key("recipe", set(data) - _TOP, _TOP)
    for key in ("project", "seed", "batch_size", "components"):
        if key not in data:
            raise PlanError(f"recipe is missing {key!r}")
    project = client.project(data["project"], create=False)
    default_branch = data.get("branch", "main")
    comps_raw = data["components"]
    if not isinstance(comps_raw, list) or not comps_raw:
        raise PlanError("recipe 'components' must be one or more [[components]] tables")
    comps = []
    for i, c in enumerate(comps_raw):
        where = f"components[{i}]"
        if not isinstance(c, dict):
            raise PlanError(f"{where} must be a table")
        if set(c) - _COMP:
            raise _unknown_key(where, set(c) - _COMP, _COMP)
        if "table" not in c:
            raise PlanError(f"{where} is missing 'table'")
        ref = project.branch(c.get("branch", default_branch)).table(c["table"])
        if "version" in c and "commit" in c:
            raise PlanError(f"{where} gives both version and commit")
        if "version" in c:
            if isinstance(c["version"], bool) or not isinstance(c["version"], int):
                raise PlanError(f"{where} 'version' must be an integer")
            table: Table = ref.at(c["version"])
        elif "commit" in c:
            table = ref.at(str(c["commit"]))
        else:
            table = ref
        windows = None
        if "windows" in c:
            if not isinstance(c["windows"], dict):
                raise PlanError(f"{where} 'windows' must be a table of column = {{...}}")
            windows = Windows({col: _window_spec(col, v, where) for col, v in c["windows"].items()})
        comps.append(
            Component(
                table,
                windows,
                weight=c.get("weight", 1.0),
                where=c.get("where"),
                episodes=c.get("episodes"),
                rename=c.get("rename"),
            )
        )
    return Recipe(data["seed"], data["batch_size"], comps, weigh_by=data.get("weigh_by"),
                  shuffle=_shuffle(data.get("shuffle")))  # fmt: skip


def _shuffle(value: Any) -> BlockShuffle | None:
    """``[shuffle]`` with any of block_rows, window_blocks, partitions: a td.BlockShuffle."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - _SHUFFLE:
        raise PlanError(f"recipe 'shuffle' must be a table of {sorted(_SHUFFLE)} (td.BlockShuffle)")
    return BlockShuffle(**value)


def load_recipe(
    path: str | Path, root: str | None = None, storage_options: dict[str, Any] | None = None
) -> Recipe:
    """A recipe from a ``.toml`` file (needs a client: ``root`` or the file's ``root``, opened
    with ``storage_options``) or a ``.py`` file that defines ``recipe``."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"recipe file {str(path)!r} does not exist")
    if path.suffix == ".py":
        return _python_recipe(path)
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise PlanError(f"recipe {str(path)!r} is not valid TOML: {e}") from None
    client = Client(read_root(root if root is not None else data.get("root")), storage_options)
    try:
        return recipe_from_toml(data, client)
    except PlanError as e:  # name the file: "recipe 'r.toml' is missing 'seed'"
        msg = str(e)
        rest = msg.removeprefix("recipe ")
        raise PlanError(f"recipe {str(path)!r}{' ' if rest != msg else ': '}{rest}") from None


def _python_recipe(path: Path) -> Recipe:
    """``recipe`` of a Python file. A bug in the file is one line naming the file and line
    (a ``TreadleError`` it raises, e.g. a table not found, passes as it is)."""
    try:
        scope = runpy.run_path(str(path), run_name="__treadle_recipe__")
        value = scope.get("recipe")
        if callable(value) and not isinstance(value, Recipe):
            value = value()
    except TreadleError:
        raise
    except Exception as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        where = f", line {frames[-1].lineno}" if frames else ""
        raise PlanError(
            f"recipe file {str(path)!r}{where} raised {type(e).__name__}: {e}"
        ) from None
    if not isinstance(value, Recipe):
        raise PlanError(f"{path} must define `recipe`, a td.Recipe or a function returning one")
    return value
