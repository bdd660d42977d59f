"""Matrices and vectors of exact numbers for the fast path: ``\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}``,
``\\begin{bmatrix} -1 & 0 \\\\ 0 & -1 \\end{bmatrix}``.

math-verify 0.9 reads them as sympy matrices, equal when every entry is (``\\frac15`` and ``1/5`` alike).
Entries are read by the caller's ``read_entry`` (exact numbers: integers, fractions, roots, multiples of
pi; no decimals, which math-verify rounds). Two matrices of the same shape are equal exactly when their
entries are, and unequal when some entry is more than 2e-6 from its counterpart (closer: the workers,
as math-verify compares numbers with a tolerance); matrices of different shapes, a matrix with a sign or
arithmetic around it (``-\\begin{pmatrix}...``, ``...+1``) and anything else are left to the workers.
Pinned against the full grader and real math-verify in ``tests/test_rewards_exact_matrices.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Dict, Optional

from .exact_sets import ExactSet

_MAX_ENTRIES = 16
_MARGIN = 2e-6
_MATRIX = re.compile(r"\\begin\{([pbv]?matrix)\}(.*)\\end\{\1\}", re.S)


@dataclass(frozen=True)
class ExactMatrix:
    """Rows of entries, each entry as its sorted ``(basis, coefficient)`` terms (basis 1, sqrt(m), pi = 0)."""

    rows: tuple


def exact_matrix(reading: str, read_entry: Callable[[str], Optional[Dict[int, Fraction]]]) -> Optional[ExactMatrix]:
    """The matrix a reading ``\\begin{pmatrix} ... \\end{pmatrix}`` (or ``bmatrix``, ``matrix``) denotes, or None."""
    m = _MATRIX.fullmatch((reading or "").strip())
    if m is None or "\\begin" in m.group(2) or m.group(1) == "vmatrix":  # vmatrix: a determinant
        return None
    rows = [row.strip() for row in m.group(2).strip().split("\\\\")]
    if rows and not rows[-1]:
        rows.pop()  # a trailing \\ before \end
    table = [[entry.strip() for entry in row.split("&")] for row in rows]
    if not table or len({len(row) for row in table}) != 1 or len(table) * len(table[0]) > _MAX_ENTRIES:
        return None
    out = []
    for row in table:
        entries = []
        for entry in row:
            terms = read_entry(entry) if entry else None
            if terms is None:
                return None
            entries.append(tuple(sorted(terms.items())))
        out.append(tuple(entries))
    return ExactMatrix(tuple(out))


def matrices_equal(gold: ExactMatrix, answer: ExactMatrix) -> Optional[bool]:
    """math-verify on two matrices of exact numbers (see the module docstring)."""
    if len(gold.rows) != len(answer.rows) or len(gold.rows[0]) != len(answer.rows[0]):
        return None
    if gold.rows == answer.rows:
        return True
    for g_row, a_row in zip(gold.rows, answer.rows):
        for g, a in zip(g_row, a_row):
            x, y = ExactSet.approx(g), ExactSet.approx(a)
            if g != a and abs(x - y) > _MARGIN * max(1.0, abs(x), abs(y)):
                return False
    return None


__all__ = ["ExactMatrix", "exact_matrix", "matrices_equal"]
