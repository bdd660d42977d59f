"""Issue 17, items 2, 3, 5, 6 and 8c: answers the grader used to grade wrong, with real math-verify.

Each case is graded by the worker's exact code (``grade_response``, in this main thread, where
math-verify's own timeouts work) and a sample of them through the real ``MathGrader`` pool.
"""

import pytest

from rlhf_ext.rewards import MathGrader, extract_answer, find_answer_candidate, latex_for_math_verify, prepare_gold
from rlhf_ext.rewards.extraction import brace_operator_arguments, join_digit_groups
from rlhf_ext.rewards.math_verify_recipe import grade_response


def graded(response, gold):
    return grade_response(response, prepare_gold(gold), {})["correct"]


# --- item 2: thousands separated by LaTeX spacing ----------------------------------------------

@pytest.mark.parametrize("spelling", ["1\\,000", "1{,}000", "1~000", "1\\!000", "1\\;000", "1\\:000", "1\\ 000",
                                      "1,000", "1000"])
def test_thousands_spellings_equal_1000_and_not_0(spelling):
    assert graded("\\boxed{%s}" % spelling, "1000") is True
    assert graded("\\boxed{%s}" % spelling, "0") is False
    assert graded("\\boxed{%s}" % spelling, "1") is False
    assert extract_answer("\\boxed{%s}" % spelling) == "1000"


@pytest.mark.parametrize("response, gold, correct", [
    ("\\boxed{12\\,345\\,678}", "12345678", True),
    ("\\boxed{1\\,000\\,000}", "#### 1,000,000", True),       # GSM8K gold
    ("\\boxed{\\$1\\,250}", "1250", True),
    ("\\boxed{-2\\,500}", "-2500", True),
    ("\\boxed{1\\,000}", "1\\,000", True),                    # the gold spelled the same way
    ("\\boxed{1000}", "1{,}000", True),
    ("\\boxed{2\\,3}", "23", False),                          # not a thousands group: left to math-verify
    ("\\boxed{3{,}5}", "3.5", False),                         # a decimal comma is not a thousands group
    ("\\boxed{1\\,00}", "100", False),                        # groups after the first have three digits
])
def test_thousands_neighbours(response, gold, correct):
    assert graded(response, gold) is correct


def test_digit_group_rewrite_is_narrow():
    assert join_digit_groups("0{,}125") == "0{,}125"  # leading zero: a decimal comma
    assert join_digit_groups("3.141\\,592") == "3.141\\,592"  # decimals are not thousands
    assert join_digit_groups("x\\,dx") == "x\\,dx"
    assert join_digit_groups("1\\,0000") == "1\\,0000"


# --- item 3: unbraced operator arguments ------------------------------------------------------

@pytest.mark.parametrize("response, gold", [
    ("\\boxed{\\frac12}", "1/2"),
    ("\\boxed{\\frac12}", "0.5"),
    ("\\boxed{\\frac{\\sqrt3}{2}}", "\\frac{\\sqrt{3}}{2}"),
    ("\\boxed{2\\sqrt3}", "2\\sqrt{3}"),
    ("\\boxed{\\dfrac 3 4}", "0.75"),
    ("\\boxed{\\tfrac13}", "\\frac{1}{3}"),
    ("\\boxed{\\frac\\pi2}", "\\frac{\\pi}{2}"),
    ("\\boxed{\\sqrt[3]2}", "\\sqrt[3]{2}"),
    ("\\boxed{\\frac{\\frac12}3}", "\\frac{1}{6}"),
    ("\\boxed{3\\sqrt2 + \\frac12}", "3\\sqrt{2}+\\frac{1}{2}"),
    ("The answer is $\\frac{\\sqrt3}2$.", "\\frac{\\sqrt{3}}{2}"),
    ("\\boxed{\\frac{1}{2}}", "\\frac12"),                    # unbraced gold
])
def test_unbraced_operators_match(response, gold):
    assert graded(response, gold) is True


@pytest.mark.parametrize("response, gold", [
    ("\\boxed{\\frac12}", "2"),
    ("\\boxed{2\\sqrt3}", "3\\sqrt{2}"),
    ("\\boxed{\\frac123}", "\\frac{1}{23}"),  # TeX reads \frac123 as \frac{1}{2}3 = 3/2
    ("\\boxed{\\sqrt34}", "\\sqrt{34}"),      # and \sqrt34 as 4\sqrt{3}
])
def test_unbraced_operators_keep_their_tex_meaning(response, gold):
    assert graded(response, gold) is False


def test_brace_rewrite_as_tex_reads_it():
    assert brace_operator_arguments("\\frac123") == "\\frac{1}{2}3"
    assert brace_operator_arguments("\\frac{a}{b}") == "\\frac{a}{b}"
    assert brace_operator_arguments("\\sqrt{x^2}") == "\\sqrt{x^2}"
    assert brace_operator_arguments("\\sqrtx") == "\\sqrtx"          # not an operator name
    assert brace_operator_arguments("\\frac(") == "\\frac("         # nothing TeX would take as an argument
    assert latex_for_math_verify("\\frac{1\\,000}3") == "\\frac{1000}{3}"
    assert extract_answer("\\boxed{\\frac{\\sqrt3}{2}}") == extract_answer("\\boxed{\\frac{\\sqrt{3}}{2}}")


# --- item 5: a bare \boxed keeps no trailing punctuation ----------------------------------------

@pytest.mark.parametrize("response, raw", [
    ("so the answer is \\boxed 5.", "5"),
    ("\\boxed 5, as required", "5"),
    ("we get \\boxed 5; done", "5"),
    ("is it \\boxed 5?", "5"),
    ("(that is \\boxed 5)", "5"),
    ("\\boxed 3.14.", "3.14"),
    ("\\boxed -7.", "-7"),
    ("\\boxed f(x).", "f(x)"),
    ("\\boxed 5", "5"),
])
def test_bare_boxed_drops_sentence_punctuation(response, raw):
    assert find_answer_candidate(response).raw == raw


def test_bare_boxed_graded():
    assert graded("so the answer is \\boxed 5.", "5") is True
    assert graded("\\boxed 5, as required", "5") is True
    assert graded("\\boxed 3.14.", "3.14") is True


# --- item 6: final-answer precedence ------------------------------------------------------------

@pytest.mark.parametrize("response, raw, source", [
    ("<think>try \\boxed{3}</think><answer>5</answer>", "5", "answer_tag"),
    ("<think>\\boxed{3}</think>\n<answer>\nThe answer is \\boxed{5}.\n</answer>", "5", "boxed"),  # boxed in the tag
    ("<answer>\\boxed{7} or maybe \\boxed{8}</answer>", "8", "boxed"),
    ("<answer>The answer is 5.</answer>", "5", "answer_tag"),
    ("\\boxed{5} ... \\boxed{}", "5", "boxed"),
    ("\\boxed{5} then \\boxed{ } and $\\boxed{}$", "5", "boxed"),
    ("\\boxed{4} ... \\boxed{5}", "5", "boxed"),
    ("<think>\\boxed{3}</think><answer></answer>", "3", "boxed"),          # an empty tag states nothing
    ("<think>\\boxed{3}</think><answer>\\boxed{}</answer>", "3", "boxed"),
    ("The answer is 4. Final answer: 6", "6", "phrase"),
])
def test_answer_tag_and_last_nonempty_box_win(response, raw, source):
    c = find_answer_candidate(response)
    assert (c.raw, c.source) == (raw, source)


@pytest.mark.parametrize("response", ["\\boxed{}", "The answer is \\boxed{}.", "The answer is $\\boxed{}$.",
                                      "<answer>\n</answer>", "<answer>\\boxed{}</answer>"])
def test_empty_answers_state_nothing(response):
    assert find_answer_candidate(response) is None


def test_precedence_graded():
    assert graded("<think>try \\boxed{3}</think><answer>5</answer>", "5") is True
    assert graded("<think>try \\boxed{3}</think><answer>5</answer>", "3") is False
    assert graded("\\boxed{5} ... \\boxed{}", "5") is True


# --- item 8: float golds ------------------------------------------------------------------------

@pytest.mark.parametrize("gold, text", [(1e20, "100000000000000000000"), (1e-07, "0.0000001"), (2.5e-3, "0.0025"),
                                        (27.0, "27.0"), (0.5, "0.5"), (1e16, "10000000000000000")])
def test_float_golds_in_positional_notation(gold, text):
    assert prepare_gold(gold) == text


def test_float_gold_1e20_matches():
    assert graded("\\boxed{100000000000000000000}", 1e20) is True
    assert graded("\\boxed{10^{20}}", 1e20) is True


# --- the same answers through the real pool ------------------------------------------------------

def test_pool_grades_the_fixed_spellings():
    cases = [("\\boxed{1\\,000}", "1000", True), ("\\boxed{1\\,000}", "0", False), ("\\boxed{\\frac12}", "1/2", True),
             ("\\boxed{2\\sqrt3}", "2\\sqrt{3}", True), ("so the answer is \\boxed 5.", "5", True),
             ("<think>try \\boxed{3}</think><answer>5</answer>", "5", True), ("\\boxed{5} ... \\boxed{}", "5", True),
             ("\\boxed{100000000000000000000}", 1e20, True)]
    with MathGrader(timeout=10, workers=2) as g:
        results = g.grade_batch([r for r, _, _ in cases], [gold for _, gold, _ in cases])
    assert [r.correct for r in results] == [c for _, _, c in cases]
    assert all(r.error is None and r.gold_parsed for r in results)
