"""Sets of exact numbers for the fast path: ``\\{1, -2\\}``, ``\\left\\{\\frac{1}{2}, \\sqrt{2}\\right\\}``.

math-verify 0.9 reads ``\\{a, b\\}`` as a sympy ``FiniteSet``: order and repeats do not matter
(``\\{1,2\\}`` equals ``\\{2,1\\}`` and ``\\{1,2,2\\}``), and two sets of exact numbers are equal exactly
when their elements are. :mod:`.exact_numbers` decides a set only against a set (math-verify accepts a
set against a tuple or a bare list, ``\\{1,2\\}`` against ``(1,2)``: the workers), with every element an
exact number (read by :func:`~.exact_numbers.exact_number`; no decimals or percentages: math-verify
compares ``\\{1.0000001, 2\\}`` against ``\\{1, 2\\}`` as different although it rounds single
numbers). Unequal sets are decided wrong only when every element that one side lacks is more than 2e-6
(relative) from every element of the other side; closer: workers.

Pinned against real math-verify and the full grader by ``tests/test_rewards_exact_expressions.py``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Dict, Optional

_MAX_ELEMENTS = 8
_MARGIN = 2e-6
_SET = re.compile(r"\\\{(.*)\\\}")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?=\\[{}])")


@dataclass(frozen=True)
class ExactSet:
    """A set of exact numbers, each as its sorted ``(basis, coefficient)`` terms (basis 1, sqrt(m), pi = 0)."""

    elements: frozenset

    @staticmethod
    def approx(element) -> float:
        return sum(float(c) * (math.pi if b == 0 else math.sqrt(b)) for b, c in element)


def _split_top_level(text: str):
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts if depth == 0 else None


def exact_set(reading: str, read_element: Callable[[str], Optional[Dict[int, Fraction]]]) -> Optional[ExactSet]:
    """The set a reading ``\\{a, b, ...\\}`` denotes, ``read_element`` giving each element's exact terms
    (None: not an exact number), or None when it is no such set."""
    m = _SET.fullmatch(_LEFT_RIGHT.sub("", reading).strip())
    if m is None or "\\{" in m.group(1) or "\\}" in m.group(1):
        return None
    parts = _split_top_level(m.group(1))
    if parts is None or not 1 <= len(parts) <= _MAX_ELEMENTS:
        return None
    elements = set()
    for part in parts:
        terms = read_element(part) if part else None
        if terms is None:
            return None
        elements.add(tuple(sorted(terms.items())))
    return ExactSet(frozenset(elements))


def sets_equal(gold: ExactSet, answer: ExactSet) -> Optional[bool]:
    """math-verify on two sets of exact numbers: equal elements are equal sets; unequal only when what
    each side lacks is far from everything on the other side (else None: workers)."""
    if gold.elements == answer.elements:
        return True
    for lacking, other in ((gold.elements - answer.elements, answer.elements),
                           (answer.elements - gold.elements, gold.elements)):
        for element in lacking:
            x = ExactSet.approx(element)
            for candidate in other:
                y = ExactSet.approx(candidate)
                if abs(x - y) <= _MARGIN * max(1.0, abs(x), abs(y)):
                    return None
    return False


__all__ = ["ExactSet", "exact_set", "sets_equal"]
