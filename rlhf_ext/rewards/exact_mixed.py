"""Two number spellings for the fast path that math-verify reads as one number: mixed numbers and digit
groups separated by LaTeX spaces.

* ``137 \\frac{1}{2}``, ``1\\frac45``, ``-1\\tfrac{1}{2}``: math-verify reads an integer written before a
  fraction as a mixed number, ``sign (n + a/b)`` (``2\\frac{3}{2}`` is 3.5, ``-1\\frac{1}{2}`` is -1.5);
* ``10,\\!080``, ``1,\\!000,\\!000``, ``10\\,080``: LaTeX's negative and thin spaces between groups of
  three digits are dropped, and the number is the integer (``10,\\!08`` is not: left to the workers).

Both are pinned against the full grader and real math-verify in ``tests/test_rewards_exact_mixed.py``
(the session-15 fast-path forms). Strings only: nothing is evaluated.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional, Tuple

_MIXED = re.compile(r"([+-]?)(\d{1,15})\s*\\[dtc]?frac(?:\{(\d{1,15})\}\{(\d{1,15})\}|(\d)(\d))")
_GROUPED = re.compile(r"[+-]?[1-9]\d{0,2}(?:(?:,\\!|\\,)\d{3}){1,10}")


def mixed_number(text: str) -> Optional[Tuple[str, Fraction]]:
    """``(kind, value)`` of a mixed number ``n \\frac{a}{b}`` as :class:`~.exact_numbers.ExactNumber` takes
    them (kind "int" or "rational"), or None (not one, or ``b`` is 0)."""
    m = _MIXED.fullmatch(text)
    if m is None:
        return None
    num, den = (m.group(3), m.group(4)) if m.group(3) is not None else (m.group(5), m.group(6))
    if int(den) == 0:
        return None
    value = int(m.group(2)) + Fraction(int(num), int(den))
    return ("int" if value.denominator == 1 else "rational"), (-value if m.group(1) == "-" else value)


def ungrouped(text: str) -> Optional[str]:
    """``10,\\!080`` / ``10\\,080`` written as ``10,080`` (the comma grouping the plain reader knows), or None."""
    if "\\" not in text or _GROUPED.fullmatch(text) is None:  # every number passes here: the cheap test first
        return None
    return text.replace(",\\!", ",").replace("\\,", ",")


__all__ = ["mixed_number", "ungrouped"]
