"""Intervals and unions of intervals with exact endpoints for the fast path: ``(2,\\infty)``,
``[-\\sqrt{2}, \\sqrt{2}]``, ``(0,9) \\cup (9,36)``.

math-verify 0.9 reads these as sympy sets (latex2sympy: ``Interval``, ``Union``), so two of them are
equal exactly when they are the same set of reals. This module compares them the same way without
sympy: each piece ``(a, b)``, ``[a, b]``, ``(a, b]``, ``[a, b)`` with exact endpoints (read by the
caller's ``read_endpoint``: integers, fractions, roots, multiples of pi; no decimals, which math-verify
rounds) or ``\\pm\\infty``; an infinite endpoint is always open (sympy: ``(2,\\infty]`` is
``(2,\\infty)``), and pieces that overlap or touch at a closed end merge (``(0,9] \\cup (9,36)`` is ``(0,36)``). Pinned against real math-verify and the
full grader by ``tests/test_rewards_exact_intervals.py``.

What is left to the workers (None): a gold that is one finite ``(a, b)`` (math-verify reads an
increasing pair as an open interval and any other as a tuple; :func:`~.exact_numbers.exact_tuple` has
those), a piece that does not increase (``[2,1]``, ``(1,1)``: a tuple or a list to math-verify), pieces
other than intervals (``\\{3\\}``, ``\\mathbb{R}``, inequalities), decimals, and two sets whose
differing endpoints are within 2e-6 of each other (math-verify's numeric tolerance).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Dict, Optional, Tuple

from .exact_sets import ExactSet

_MAX_PIECES = 6
_MARGIN = 2e-6
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?=[\[\]()])")
_PIECE = re.compile(r"([\[(])([^\[\](),]+),([^\[\](),]+)([\])])")
_INFINITY = {"\\infty": math.inf, "+\\infty": math.inf, "-\\infty": -math.inf}

# an endpoint: (its value as a float for ordering, a key that is equal exactly when the numbers are)
Endpoint = Tuple[float, object]


@dataclass(frozen=True)
class ExactIntervals:
    """A set of reals as its merged pieces ``(lo, lo_closed, hi, hi_closed)``, in increasing order."""

    pieces: Tuple[Tuple[Endpoint, bool, Endpoint, bool], ...]


def _endpoint(text: str, read_endpoint: Callable[[str], Optional[Dict[int, Fraction]]]) -> Optional[Endpoint]:
    text = text.strip()
    if text in _INFINITY:
        return (_INFINITY[text], text.lstrip("+"))
    terms = read_endpoint(text) if text else None
    if terms is None:
        return None
    return (ExactSet.approx(terms.items()), tuple(sorted(terms.items())))


def _order(a: Endpoint, b: Endpoint) -> Optional[int]:
    """-1, 0, 1 for a < b, a == b, a > b; None when two different numbers are too close to order by floats."""
    if a[1] == b[1]:
        return 0
    if a[0] == b[0] or (math.isfinite(a[0]) and math.isfinite(b[0])
                        and abs(a[0] - b[0]) <= 1e-9 * max(1.0, abs(a[0]), abs(b[0]))):
        return None
    return -1 if a[0] < b[0] else 1


def _split_union(text: str):
    parts = [p.strip() for p in re.split(r"\\cup", text)]
    return parts if all(parts) and len(parts) <= _MAX_PIECES else None


def exact_intervals(reading: str, read_endpoint: Callable[[str], Optional[Dict[int, Fraction]]], *,
                    gold: bool) -> Optional[ExactIntervals]:
    """The set a reading denotes when it is an interval or a union of intervals with exact endpoints,
    else None (see the module docstring for what is refused, ``gold`` or answer)."""
    text = _LEFT_RIGHT.sub("", reading or "").strip()
    if not text or text[0] not in "[(" or "," not in text:
        return None
    parts = _split_union(text)
    if parts is None:
        return None
    raw = []
    for part in parts:
        m = _PIECE.fullmatch(part)
        if m is None:
            return None
        lo, hi = _endpoint(m.group(2), read_endpoint), _endpoint(m.group(3), read_endpoint)
        if lo is None or hi is None or lo[0] == math.inf or hi[0] == -math.inf:
            return None
        raw.append((lo, m.group(1) == "[" and math.isfinite(lo[0]), hi, m.group(4) == "]" and math.isfinite(hi[0]),
                    m.group(1) + m.group(4)))
    if len(raw) == 1 and raw[0][4] == "()" and math.isfinite(raw[0][0][0]) and math.isfinite(raw[0][2][0]):
        if gold:
            return None  # a tuple or an interval by the order of its numbers: exact_tuple's
    pieces = []
    for lo, lo_closed, hi, hi_closed, _ in raw:
        order = _order(lo, hi)
        if order is None:
            return None
        if order >= 0:
            return None  # math-verify reads a pair that does not increase as a tuple or a list, not as a set
        pieces.append((lo, lo_closed, hi, hi_closed))
    return _merged(pieces)


def _merged(pieces) -> Optional[ExactIntervals]:
    for i in range(len(pieces)):  # sort by the lower end (closed first); insertion sort with exact ties
        for j in range(i, 0, -1):
            order = _order(pieces[j - 1][0], pieces[j][0])
            if order is None:
                return None
            if order < 0 or (order == 0 and (pieces[j - 1][1] or not pieces[j][1])):
                break
            pieces[j - 1], pieces[j] = pieces[j], pieces[j - 1]
    out = []
    for piece in pieces:
        if out:
            lo, lo_closed, hi, hi_closed = out[-1]
            touch = _order(piece[0], hi)
            if touch is None:
                return None
            if touch < 0 or (touch == 0 and (hi_closed or piece[1])):
                end = _order(piece[2], hi)
                if end is None:
                    return None
                if end > 0:
                    out[-1] = (lo, lo_closed, piece[2], piece[3])
                elif end == 0:
                    out[-1] = (lo, lo_closed, hi, hi_closed or piece[3])
                continue
        out.append(piece)
    return ExactIntervals(tuple(out))


def _key(pieces):
    return tuple((lo[1], lc, hi[1], hc) for lo, lc, hi, hc in pieces)


def intervals_equal(gold: ExactIntervals, answer: ExactIntervals) -> Optional[bool]:
    """math-verify on two sets of reals: the same merged pieces are equal; different are not, unless every
    differing endpoint is within 2e-6 of its counterpart (math-verify's tolerance: workers)."""
    if _key(gold.pieces) == _key(answer.pieces):
        return True
    if len(gold.pieces) == len(answer.pieces) and all(
            g[1] == a[1] and g[3] == a[3] for g, a in zip(gold.pieces, answer.pieces)):
        close = True
        for g, a in zip(gold.pieces, answer.pieces):
            for x, y in ((g[0], a[0]), (g[2], a[2])):
                if x[1] != y[1] and not (math.isfinite(x[0]) and math.isfinite(y[0])
                                         and abs(x[0] - y[0]) <= _MARGIN * max(1.0, abs(x[0]), abs(y[0]))):
                    close = False
        if close:
            return None
    return False


__all__ = ["ExactIntervals", "exact_intervals", "intervals_equal"]
