"""A number added to an answer in parentheses, ``(A)+1`` or ``(A)-2``, for the fast path (issue 41).

The near miss a policy writes when it stops one step short, and the issue's own example of one: the gold's
form in parentheses, then a number added. Two kinds, as math-verify reads them (pinned against the full
grader and real math-verify in ``tests/test_rewards_exact_near_misses.py``):

* ``A`` a structure of the gold's kind -- a tuple, a set or a matrix of two or more exact numbers, an
  interval or union of intervals: sympy adds no number to a ``Tuple``, ``FiniteSet``, ``Interval`` or
  matrix, so latex2sympy reads no value and the answer is wrong whatever ``A`` is;
* ``A`` a number in a spelling whose mark math-verify's normalization drops wherever it stands: degrees
  ``120^\\circ``, a mixed number ``137 \\frac{1}{2}``, a dollar amount ``\\$36``; the sum is compared as a
  number (``(119^\\circ)+1`` equals ``120^\\circ``). Digit groups (``10,\\!080``) are not: inside parentheses
  math-verify reads their comma as a tuple's.

Strings and fractions only: nothing is evaluated.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Callable, Optional

from .exact_intervals import ExactIntervals
from .exact_matrices import ExactMatrix
from .exact_sets import ExactSet

# "(A)+1": the parentheses around all of A, then a sign and a whole number
_PLUS_NUMBER = re.compile(r"\((.+)\)\s*([+-])\s*(\d{1,9})")
# the spellings of A whose mark math-verify drops anywhere: degrees, a mixed number, dollars (no commas)
_DROPPED_MARK = re.compile(r"-?\d{1,9}\^(?:\\circ|\{\\circ\})|-?\d{1,9}\s*\\[dt]?frac(?:\{\d{1,9}\}\{\d{1,9}\}|\d\d)"
                           r"|\\\$\s*\d{1,9}(?:\.\d{1,6})?")


def _balanced(text: str) -> bool:
    """Whether every parenthesis of ``text`` closes in it, none before it opens (so ``(A)`` wraps all of A)."""
    depth = 0
    for c in text:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def split_plus_number(raw: str):
    """``(A)+N`` -> ``(A, N)`` (N negative for a minus), or None when ``raw`` is not of that form."""
    m = _PLUS_NUMBER.fullmatch(raw.strip())
    if m is None or not _balanced(m.group(1)):
        return None
    n = int(m.group(3))
    return m.group(1).strip(), (-n if m.group(2) == "-" else n)


def structure_plus_number(raw: str, read: Callable[[str], object]) -> Optional[bool]:
    """False (wrong) when ``raw`` is ``(A)+N`` and ``read`` (the reader of the gold's structure kind) reads A
    as a structure of two or more elements; None otherwise."""
    split = split_plus_number(raw)
    if split is None:
        return None
    return False if _no_number(read(split[0])) else None


def _no_number(structure) -> bool:
    """Whether math-verify holds ``structure`` as something no number is added to: an interval, or a
    tuple, set or matrix of two or more (a one-element set or matrix may be read as its element)."""
    if isinstance(structure, ExactIntervals):
        return bool(structure.pieces)
    if isinstance(structure, ExactSet):
        return len(structure.elements) >= 2
    if isinstance(structure, ExactMatrix):
        return sum(len(row) for row in structure.rows) >= 2
    return isinstance(structure, tuple) and len(structure) >= 2


def number_plus_number(raw: str, number: Callable[[str], object]):
    """``(kind, value)`` of ``(A)+N`` when A is a degree, mixed-number or dollar spelling that ``number``
    (the fast path's reader) reads as an integer, fraction or decimal; None otherwise."""
    split = split_plus_number(raw)
    if split is None or not _DROPPED_MARK.fullmatch(split[0]):
        return None
    a = number(split[0].replace("\\$", "", 1).strip())  # the dollar sign goes as math-verify drops it
    if a is None or getattr(a, "kind", None) not in ("int", "rational", "float") or a.percent:
        return None
    value = a.value + Fraction(split[1])
    kind = a.kind if a.kind == "float" else ("int" if value.denominator == 1 else "rational")
    return kind, value
