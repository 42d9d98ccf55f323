"""What a loader and its worker processes say to each other, in one place.

A worker sends one :class:`Message` per step it read: ``BATCH`` (the step, the slot it wrote
the batch into, the slot's layout), or ``ERROR`` (the exception, pickled, with the worker's
traceback as a note) and nothing after it; ``END`` once its steps are done. The loader
sends back the index of each slot it has copied a batch out of, in the order it got them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

BATCH, ERROR, END = "batch", "error", "end"


class Message(NamedTuple):
    """A worker's message to its loader."""

    kind: str
    step: int | None = None
    slot: int | None = None
    payload: Any = None  # BATCH: the slot's layout; ERROR: the exception


def batch(step: int, slot: int, layout: Any) -> Message:
    """Step ``step``'s batch is in slot ``slot``, laid out as ``layout``."""
    return Message(BATCH, step, slot, layout)


def error(exc: BaseException) -> Message:
    """The worker failed with ``exc``."""
    return Message(ERROR, payload=exc)


def end() -> Message:
    """The worker read all its steps."""
    return Message(END)
