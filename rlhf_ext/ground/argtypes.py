"""Argument types shared by the ``rlhf-ext`` subcommands: each rejects bad input with a message naming it.

The tools' own modules (:mod:`rlhf_ext.alignment`, :mod:`rlhf_ext.data.cli`) declare their
arguments with these too, so they live at the ground floor, below both those modules and the
``rlhf-ext`` command that dispatches to them (``rlhf_ext.cli.argtypes`` forwards here).
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, TypeVar

T = TypeVar("T", int, float)


def _parse(text: str, cast: Callable[[str], T], expected: str) -> T:
    try:
        return cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _parse(text, int, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _parse(text, int, "a whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _parse(text, float, "a number")
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def port(text: str) -> int:
    value = _parse(text, int, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535 (0 = any free port), got {value}")
    return value


def positive_seconds(text: str) -> float:
    value = _parse(text, float, "a number of seconds")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def probability(text: str) -> float:
    value = _parse(text, float, "a number in [0, 1]")
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {value}")
    return value


__all__ = ["port", "positive_float", "positive_int", "positive_seconds", "probability"]
