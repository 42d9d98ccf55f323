"""Validation of user-chosen names (projects, branches, tables, episodes).

A name becomes one path segment under the store's root, so it must never be
able to climb out of it: no separators, no ``..``, no control characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from treadle.errors import AlreadyExists, InvalidName

#: Endings of the per-column keys a batch generates (``<col>_is_pad`` ...): no column may
#: have one (:mod:`treadle.plan.reserved`); a name starting with ``_`` is refused anyway.
RESERVED_SUFFIXES = ("_is_pad", "_dim_mask", "_is_present")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_name(name: object, kind: str) -> str:
    """Return ``name`` if it is a safe single path segment, else raise :class:`InvalidName`."""
    if not isinstance(name, str):
        raise InvalidName(f"{kind} name must be a string, got {type(name).__name__}: {name!r}")
    if not name:
        raise InvalidName(f"{kind} name is empty")
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidName(
            f"invalid {kind} name {name!r}: use 1-128 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit, with no '..'"
        )
    if kind == "column" and "." in name:
        raise InvalidName(
            f"invalid column name {name!r}: '.' is not allowed (Lance reads it as a nested "
            "field); use '_' instead"
        )
    return name


def check_case_apart(name: str, existing: Iterable[str], kind: str, where: str) -> None:
    """:class:`AlreadyExists` if a new ``name`` differs from one of ``existing`` only in
    case: on a store that folds case (macOS and Windows disks) both would be one folder,
    and writes and gc of one would act on the other's files."""
    for other in existing:
        if other != name and other.lower() == name.lower():
            raise AlreadyExists(
                f"{where} already has {kind} {other!r}; {name!r} differs only in case, and "
                f"would share its folder on a store that ignores case: use another name"
            )


def reserved_column_reason(name: str) -> str | None:
    """Why ``name`` may not be a column's name (a batch key treadle generates), or None."""
    if name.startswith("_"):
        return "names starting with '_' are reserved for the keys treadle adds to a batch"
    for suffix in RESERVED_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            return (
                f"names ending with {suffix!r} are reserved: a batch carries "
                f"'<column>{suffix}' beside a column, so it would collide with the flag "
                f"of a column {base!r}"
            )
    return None
