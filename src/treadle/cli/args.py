"""The grammar every ``treadle`` command shares: global options, checked argument types.

Global options (``--root``, ``--storage-option``, ``--config``, ``--quiet``, ``--json``)
are added to the top parser *and* to every leaf sub-command, so they may come before or
after the command (``treadle --root R demo`` and ``treadle demo --root R`` are the same).
Both copies default to ``argparse.SUPPRESS`` under different names; :func:`resolve`
merges them (the one after the command wins; ``--storage-option`` lists add up) into
``args.root``, ``args.storage_options``, ``args.quiet`` and ``args.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import tomllib
from collections.abc import Callable
from typing import Any

from treadle.errors import TreadleError

EXIT_CODES = """\
exit codes:
  0  success
  1  user error: one line on stderr naming the thing (project, table, file, option)
  2  usage error: unknown command or option, missing or out-of-range argument

Global options may come before or after the command:
  treadle --root /data/store demo   ==   treadle demo --root /data/store
Storage options (credentials, endpoints) come from --storage-option KEY=VALUE, a --config
file's [storage] table, or the environment (AWS_*, GOOGLE_*, AZURE_*).
"""

TOP = "top_"  # dest prefix of the copies on the top-level parser


class ConfigError(TreadleError, ValueError):
    """A ``--config`` file or ``--storage-option`` that cannot be used."""


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def float_at_least(low: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number ``>= low``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {low:g}, got {text}")
        return value

    parse.__name__ = f"number >= {low:g}"
    return parse


def key_value(text: str) -> tuple[str, str]:
    """An argparse ``type``: ``KEY=VALUE`` with a non-empty key."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():  # the text is not echoed: it may be a secret
        raise argparse.ArgumentTypeError("takes KEY=VALUE (a key, '=', then the value)")
    return key.strip(), value


_GLOBALS: list[tuple[str, dict[str, Any]]] = [
    (
        "--root",
        {
            "metavar": "ROOT",
            "help": "store root: a path or s3://, gs://, az://, file:// URL "
            "(default: $TREADLE_ROOT, else ~/.treadle)",
        },  # fmt: skip
    ),
    (
        "--storage-option",
        {
            "action": "append",
            "type": key_value,
            "metavar": "KEY=VALUE",
            "help": "an object-store option, e.g. aws_endpoint=http://127.0.0.1:8333 or "
            "allow_http=true (repeatable; overrides --config)",
        },  # fmt: skip
    ),
    (
        "--config",
        {
            "metavar": "FILE",
            "help": "TOML file with a [storage] table of storage options "
            '(and optionally root = "...")',
        },  # fmt: skip
    ),
    ("--quiet", {"action": "store_true", "help": "no progress bars or progress lines"}),
    ("--json", {"action": "store_true", "help": "print the command's data as JSON"}),
]


def add_global_options(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """Add the global options to ``parser`` (skipping any flag it already defines)."""
    group = parser.add_argument_group("global options")
    for flag, kwargs in _GLOBALS:
        if flag in parser._option_string_actions:
            continue  # the command has its own (e.g. ``plan --root``): resolve() reads it
        dest = flag[2:].replace("-", "_")
        group.add_argument(
            flag, dest=(TOP + dest) if top else dest, default=argparse.SUPPRESS, **kwargs
        )


def leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser of the tree under ``parser`` that has no sub-commands of its own."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    out: list[argparse.ArgumentParser] = []
    seen: set[int] = set()
    for action in subs:
        for child in action.choices.values():
            if id(child) not in seen:  # aliases share one parser
                seen.add(id(child))
                out += leaf_parsers(child)
    return out


def install(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and each of its leaf sub-commands the global options."""
    add_global_options(parser, top=True)
    for leaf in leaf_parsers(parser):
        if leaf is not parser:
            add_global_options(leaf)


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Merge the two copies of each global option and load ``--config`` (in place)."""

    def pick(name: str) -> Any:
        after = getattr(args, name, None)
        return after if after not in (None, False) else getattr(args, TOP + name, None)

    args.config = pick("config")
    args.quiet = bool(pick("quiet"))
    args.json = bool(pick("json"))
    pairs = list(getattr(args, TOP + "storage_option", None) or []) + list(
        getattr(args, "storage_option", None) or []
    )
    options: dict[str, Any] = {}
    root = pick("root")
    if args.config:
        file_root, file_options = read_config(args.config)
        options.update(file_options)
        root = root or file_root
    options.update(dict(pairs))
    if root is not None and not str(root).strip():  # `--root "$UNSET"` must not mean "here"
        raise ConfigError("--root is empty (an unset shell variable?): give a path or URL")
    args.root = root
    args.storage_options = options
    return args


def read_root(root: str | None) -> str | None:
    """The root a command that only reads opens: ``root``, else ``$TREADLE_ROOT`` as if it
    were given with ``--root`` (a missing folder is an error: a typo in the variable made
    an empty store and listed nothing), else None (``~/.treadle``, made if missing)."""
    if root is not None:
        return root
    env = os.environ.get("TREADLE_ROOT") or None
    if env is not None and "://" not in env and not os.path.exists(os.path.expanduser(env)):
        raise ConfigError(
            f"$TREADLE_ROOT {env!r} does not exist: check the variable (treadle import and "
            "treadle demo create their root)"
        )
    return env


def read_config(path: str) -> tuple[str | None, dict[str, Any]]:
    """``(root, storage_options)`` from a TOML file: optional ``root``, a ``[storage]`` table."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path!r} cannot be read: {e}") from None
    unknown = sorted(set(data) - {"root", "storage"})
    if unknown:
        raise ConfigError(
            f"config file {path!r} has unknown key {unknown[0]!r} (known: root, storage)"
        )
    storage = data.get("storage", {})
    if not isinstance(storage, dict) or any(isinstance(v, dict | list) for v in storage.values()):
        raise ConfigError(f"config file {path!r}: [storage] must be a table of KEY = value")
    root = data.get("root")
    if root is not None and not isinstance(root, str):
        raise ConfigError(f"config file {path!r}: root must be a string")
    return root, dict(storage)
