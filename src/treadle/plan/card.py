"""The run record as a readable card, and ``treadle plan RECIPE.toml|recipe.py``.

A TOML recipe::

    project = "robotics"
    branch = "main"              # default branch of every component (default "main")
    root = "s3://bucket/prefix"  # optional; else --root, else $TREADLE_ROOT or ~/.treadle
    seed = 2048
    batch_size = 64

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

A window is ``kind`` (``"video"`` or ``"rows"``) with ``range = [start, stop)``, ``offsets``
or ``seconds`` (with ``tolerance_s``), and ``pad = true`` for edge padding;
video windows also take ``size``, ``layout``, ``dtype``, ``mean``, ``std`` (see ``td.Video``).
Storage credentials come from the environment, never from the recipe file.

A Python recipe is a file that defines ``recipe`` (a ``td.Recipe``, or a function returning one).
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import tomllib
from fractions import Fraction
from pathlib import Path
from typing import Any

from treadle.cliargs import int_at_least
from treadle.errors import PlanError, TreadleError
from treadle.plan.plan import Plan
from treadle.plan.recipe import Component, Recipe
from treadle.plan.record import RunRecord
from treadle.plan.windows import Rows, Spec, Windows, spec_from_json

_TOP = {"project", "branch", "root", "seed", "batch_size", "components"}
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


# -- the card -------------------------------------------------------------------------------


def _offsets_text(offsets: tuple[int, ...]) -> str:
    if len(offsets) > 2 and offsets == tuple(range(offsets[0], offsets[-1] + 1)):
        return f"{offsets[0]}..{offsets[-1]}"
    if len(offsets) > 6:
        return ", ".join(str(o) for o in offsets[:5]) + f", … ({len(offsets)})"
    return ", ".join(str(o) for o in offsets)


def _spec_text(spec: Spec) -> str:
    pad = " pad" if spec.pad else ""
    if isinstance(spec, Rows):
        return f"Rows[{_offsets_text(spec.offsets)}]{pad}"
    extra = ["pad"] if spec.pad else []
    if spec.size:
        extra.append(f"{spec.size[0]}x{spec.size[1]}")
    if spec.layout != "THWC":
        extra.append(spec.layout)
    if spec.dtype != "uint8":
        extra.append(spec.dtype)
    tail = (" " + " ".join(extra)) if extra else ""
    return f"Video[{_offsets_text(spec.offsets)}]{tail}"


def windows_text(windows: Windows | None) -> str:
    """``cam Video[0..89] 224x224, action Rows[0..89]``; ``every column at the moment``."""
    if windows is None:
        return "every column at the moment"
    if not windows.specs:
        return "no columns"
    return ", ".join(f"{col} {_spec_text(spec)}" for col, spec in windows.items())


KEPT_WARNING = 0.9
"""The card warns when a component keeps fewer than this share of its table's moments."""


def kept_text(kept: int, moments: int) -> str:
    """``18 of 24 moments kept (75%)``."""
    pct = 100 * kept / moments if moments else 0.0
    return f"{kept:,} of {moments:,} moments kept ({pct:.0f}%)"


def _weight_text(w: float) -> str:
    return f"{w:.6g}"


def share_text(asked: Fraction, planned: Fraction) -> str:
    """``share 3/10 = 0.3, exact`` or ``share asked 0.0333333333, planned 33333/999999 = ...``."""
    if asked == planned:
        return f"share {planned.numerator}/{planned.denominator} = {float(planned):.9g}, exact"
    return (
        f"share asked {float(asked):.9g}, planned {planned.numerator}/{planned.denominator} "
        f"= {float(planned):.9g} (off by {float(abs(planned - asked)):.2g})"
    )


def render_card(
    record: RunRecord, *, world_size: int = 1, plan: Plan | None = None, slots: int = 3
) -> str:
    """The run record as text: pinned tables, weights and per-batch counts, seed, rank slots.

    With ``plan``, each rank's first slots of step 0 also show which sample they hold
    (``c<component>:<moment>``).
    """
    b = record.batch_size
    d = record.weight_denominator
    lines = [
        f"Run record {record.run_id} · {record.project} · {record.algorithm}",
        f"{len(record.tables)} tables · {len(record.components)} components · "
        f"seed {record.seed} · batch {b}",
        "",
        "01 Pin each table to a version.",
    ]
    width = max(len(t.name) for t in record.tables)
    for t in record.tables:
        where = (
            f"{t.branch} ({t.commit[:8]})"
            if t.branch and t.commit
            else (t.commit[:8] if t.commit else "pinned")
        )
        lines.append(
            f"   {t.name:<{width}} @ {where} v{t.version} → {t.num_moments:,} moments, "
            f"{t.num_episodes:,} episodes"
        )
    lines += ["", f"02 Plan weighted draws. Each batch of {b} holds, per component:"]
    asked = record.asked_weights
    for i, c in enumerate(record.components):
        t = record.tables[c.table]
        n = c.weight_quantised
        lo, hi = n * b // d, -(-n * b // d)
        per_batch = f"{lo}" if lo == hi else f"{lo} or {hi}"
        lines.append(
            f"   [{i}] {t.name:<{width}}  weight {_weight_text(c.weight)} → "
            f"{share_text(asked[i], Fraction(n, d))}  ·  {per_batch} per batch  ·  "
            f"{kept_text(c.eligible, t.num_moments)}"
        )
        lines.append(f"       windows: {windows_text(c.windows)}")
        for key, value in c.selection().items():
            if key == "episodes" and len(value) > 5:
                value = f"{len(value):,} episodes ({', '.join(value[:5])}, …)"
            lines.append(f"       {key}: {value}")
        if c.eligible < KEPT_WARNING * t.num_moments:
            why = (
                "its where/episodes selection and windows leave the rest"
                if c.selection().keys() & {"where", "episodes"}
                else "windows that reach past an episode's ends drop its first/last moments "
                "(pad=True keeps them)"
            )
            lines.append(
                f"       warning: this recipe keeps {c.eligible / t.num_moments:.0%} of "
                f"table {t.name!r}'s moments as anchors; {why}"
            )
    lines.append(f"   seed = {record.seed}")
    lines += [
        "",
        f"03 Divide the work among ranks ({world_size} rank"
        f"{'s' if world_size != 1 else ''}, {b // world_size if b % world_size == 0 else '?'}"
        " slots each).",
    ]
    if b % world_size:
        lines.append(f"   batch size {b} is not divisible by {world_size} ranks")
    else:
        digits = max(4, len(str(b - 1)))
        for r in range(world_size):
            first = list(range(r, b, world_size))[:slots]
            text = ", ".join(f"{s:0{digits}d}" for s in first)
            more = ", …" if b // world_size > slots else ""
            line = f"   rank {r} [{text}{more}]"
            if plan is not None:
                batch = plan.batch(0, r, world_size)
                samples = ", ".join(
                    f"c{c}:{m}"
                    for c, m in zip(batch.component[:slots].tolist(), batch.moment[:slots].tolist())
                )
                line += f"  step 0: {samples}{more}"
            lines.append(line)
    return "\n".join(lines) + "\n"


# -- recipes from files ---------------------------------------------------------------------


def _window_spec(col: str, value: Any, where: str) -> Spec:
    if not isinstance(value, dict):
        raise PlanError(f'{where}: window {col!r} must be a table like {{ kind = "video", ... }}')
    unknown = sorted(set(value) - _SPEC)
    if unknown:
        raise PlanError(f"{where}: window {col!r} has unknown key {unknown[0]!r}")
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
    if "kind" not in spec:
        raise PlanError(f'{where}: window {col!r} needs kind = "video" or "rows"')
    try:
        return spec_from_json(spec)
    except PlanError as e:
        raise PlanError(f"{where}: window {col!r}: {e}") from None


def recipe_from_toml(data: dict[str, Any], client: Any) -> Recipe:
    """Build a :class:`Recipe` from a parsed TOML recipe (format in the module docstring)."""
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise PlanError(f"recipe has unknown key {unknown[0]!r} (known: {sorted(_TOP)})")
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
        bad = sorted(set(c) - _COMP)
        if bad:
            raise PlanError(f"{where} has unknown key {bad[0]!r} (known: {sorted(_COMP)})")
        if "table" not in c:
            raise PlanError(f"{where} is missing 'table'")
        ref = project.branch(c.get("branch", default_branch)).table(c["table"])
        if "version" in c and "commit" in c:
            raise PlanError(f"{where} gives both version and commit")
        if "version" in c:
            if isinstance(c["version"], bool) or not isinstance(c["version"], int):
                raise PlanError(f"{where} 'version' must be an integer")
            table: Any = ref.at(c["version"])
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
    return Recipe(data["seed"], data["batch_size"], comps)


def load_recipe(
    path: str | Path, root: str | None = None, storage_options: dict[str, Any] | None = None
) -> Recipe:
    """A recipe from a ``.toml`` file (needs a client: ``root`` or the file's ``root``, opened
    with ``storage_options``) or a ``.py`` file that defines ``recipe``."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"recipe file {str(path)!r} does not exist")
    if path.suffix == ".py":
        scope = runpy.run_path(str(path), run_name="__treadle_recipe__")
        value = scope.get("recipe")
        if callable(value) and not isinstance(value, Recipe):
            value = value()
        if not isinstance(value, Recipe):
            raise PlanError(f"{path} must define `recipe`, a td.Recipe or a function returning one")
        return value
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise PlanError(f"recipe {str(path)!r} is not valid TOML: {e}") from None
    from treadle.catalog import Client

    client = Client(root if root is not None else data.get("root"), storage_options)
    return recipe_from_toml(data, client)


# -- CLI ------------------------------------------------------------------------------------


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``treadle plan`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "plan",
        help="pin a recipe's tables and print its run record as a card",
        description="Pin every table of a recipe (RECIPE.toml or recipe.py) and print the run "
        "record: tables with commit and moment counts, weights, per-batch counts, seed, "
        "and the first slots of each rank.",
    )
    p.add_argument("recipe", help="a .toml recipe or a .py file that defines `recipe`")
    p.add_argument("--root", default=None, help="store root (overrides the TOML file's root)")
    p.add_argument(
        "--world-size", type=int_at_least(1), default=1, help="ranks to show (>= 1; default 1)"
    )
    p.add_argument(
        "--slots", type=int_at_least(1), default=3, help="slots to show per rank (>= 1; default 3)"
    )
    p.add_argument("--json", action="store_true", help="print the run record as JSON instead")
    p.set_defaults(func=plan_command)
    return p


def plan_command(args: argparse.Namespace) -> int:
    """``treadle plan``: print the card (or ``--json``); 1 with a clear message on bad input."""
    try:
        options = getattr(args, "storage_options", None) or None
        recipe = load_recipe(args.recipe, getattr(args, "root", None), options)
        plan = recipe.plan()
        if getattr(args, "json", False):
            print(json.dumps(plan.record.to_dict(), sort_keys=True, indent=2))
            return 0
        world = getattr(args, "world_size", 1)
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise PlanError(f"--world-size must be a positive integer, got {world!r}")
        if plan.batch_size % world:
            raise PlanError(
                f"batch_size {plan.batch_size} is not divisible by --world-size {world}"
            )
        slots = max(1, int(getattr(args, "slots", 3)))
        sys.stdout.write(render_card(plan.record, world_size=world, plan=plan, slots=slots))
        return 0
    except (TreadleError, ValueError) as e:
        print(f"treadle plan: {e}", file=sys.stderr)
        return 1
