"""Issue 41, item 3: the fast path decides matrices and vectors of exact numbers as math-verify does
(:mod:`rlhf_ext.rewards.exact_matrices`): each case against the full grader (the worker's code,
``grade_response``) and real math-verify, in reward and in evaluation mode."""

import logging

import pytest

from test_rewards_exact_mixed import both_modes

from rlhf_ext.rewards.exact_matrices import exact_matrix
from rlhf_ext.rewards.exact_numbers import _set_element

logging.getLogger("math_verify").setLevel(logging.ERROR)

COLUMN = "\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}"
SQUARE = "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}"
DECIDED = [  # (answer, gold, math-verify's verdict)
    (COLUMN, COLUMN, True), ("\\begin{pmatrix}1/5\\\\-18/5\\end{pmatrix}", COLUMN, True),
    ("\\begin{pmatrix} \\frac15 \\\\ -\\frac{18}{5} \\end{pmatrix}", COLUMN, True),
    ("\\begin{bmatrix} 1/5 \\\\ -18/5 \\end{bmatrix}", COLUMN, True),
    ("\\begin{pmatrix} 1/5 \\\\ -18/6 \\end{pmatrix}", COLUMN, False),
    (SQUARE, SQUARE, True), ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -2 \\end{pmatrix}", SQUARE, False),
    ("\\begin{pmatrix} \\sqrt{2} \\\\ 1 \\end{pmatrix}", "\\begin{pmatrix} \\sqrt2 \\\\ 1 \\end{pmatrix}", True),
    ("\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", False),
    ("\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}", "\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}", True),
    ("\\begin{pmatrix} -18 \\\\ -49 \\\\ 97 \\end{pmatrix}", "\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}", False),
]
UNDECIDED = [  # a decimal entry, another shape, a sign or arithmetic around it, a determinant, a tuple
    ("\\begin{pmatrix} 0.2 \\\\ -3.6 \\end{pmatrix}", COLUMN), ("\\begin{pmatrix} 1/5 & -18/5 \\end{pmatrix}", COLUMN),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\\\ 0 & 0 \\end{pmatrix}", SQUARE),
    ("-\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", SQUARE), (SQUARE + "+1", SQUARE),
    ("\\begin{vmatrix} -1 & 0 \\\\ 0 & -1 \\end{vmatrix}", SQUARE), ("(1/5, -18/5)", COLUMN),
]


@pytest.mark.parametrize("answer, gold, correct", DECIDED)
def test_decided_verdicts_equal_the_full_path_and_math_verify(answer, gold, correct):
    for quick, full in both_modes(answer, gold):
        assert full["correct"] is correct
        assert quick is not None and quick["correct"] is correct, quick


@pytest.mark.parametrize("answer, gold", UNDECIDED)
def test_left_to_the_workers(answer, gold):
    for quick, full in both_modes(answer, gold):
        assert quick is None, quick
        assert isinstance(full["correct"], bool)


def test_the_reader_by_hand():
    m = exact_matrix("\\begin{pmatrix} 1 & \\frac{1}{2} \\\\ \\sqrt{8} & 0 \\\\ \\end{pmatrix}", _set_element)
    assert m is not None and len(m.rows) == 2 and len(m.rows[0]) == 2
    assert m.rows[1][0] == ((2, 2),)  # sqrt(8) = 2 sqrt(2), as terms (basis 2, coefficient 2)
    assert exact_matrix("\\begin{pmatrix} 1 & 2 \\\\ 3 \\end{pmatrix}", _set_element) is None  # ragged
    assert exact_matrix("\\begin{pmatrix} x \\\\ 1 \\end{pmatrix}", _set_element) is None
