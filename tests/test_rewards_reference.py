"""Issue 21: grading that holds up against math-verify as its own test suite and lighteval call it.

The reference is real math-verify, called as its own test suite calls it (tests/test_all.py in huggingface/Math-Verify)
(``parse(x, [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()])`` and
``verify(gold, pred, float_rounding=6, strict=True)``): with those defaults it reads every box and
extracts without an anchor. Ours is the worker's exact code (``grade_response``) in this main thread,
in both modes: ``require_anchor=True`` (rewards) and ``False`` (evaluation); a sample of the cases
also goes through the real ``MathGrader`` pool, per sample and batched.

Every right case has its wrong twin, and nothing the reference calls wrong is right here.
"""

import pickle
import time
from types import SimpleNamespace

import pytest
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rlhf_ext.rewards import MathGrader, extract_answer, find_answer_candidate, normalize_answer, prepare_gold
from rlhf_ext.rewards.extraction import decimal_comma, find_final_boxes, find_last_expression, strip_number_unit
from rlhf_ext.rewards.math_verify_recipe import grade_response

_REFERENCE_CONFIG = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def reference(gold: str, response: str) -> bool:
    """math-verify's verdict as its test suite computes it (only ever called on our own fixed strings:
    ExprExtractionConfig runs sympy's parser on them)."""
    return bool(verify(parse(gold, _REFERENCE_CONFIG), parse(response, _REFERENCE_CONFIG), float_rounding=6,
                       strict=True))


def ours(response: str, gold, require_anchor: bool = True) -> dict:
    return grade_response(response, prepare_gold(gold), {}, require_anchor=require_anchor)


def both_modes(response: str, gold):
    return ours(response, gold, True)["correct"], ours(response, gold, False)["correct"]


# --- item 1: several boxed answers, on both sides ----------------------------------------------

MULTI_BOX = [
    # (response, gold, correct) -- the reference agrees on each (asserted below)
    ("The solutions are \\boxed{2} and \\boxed{5}.", "$2, 5$", True),
    ("The solutions are \\boxed{2} and \\boxed{5}.", "$\\{2, 5\\}$", True),
    ("The solutions are \\boxed{5} and \\boxed{2}.", "$2, 5$", True),          # a set: order is free
    ("The solutions are \\boxed{2} and \\boxed{6}.", "$2, 5$", False),         # wrong twin
    ("The solutions are \\boxed{2} and \\boxed{5}.", "$2$", False),            # one gold, two answers
    ("The solutions are \\boxed{2} and \\boxed{5}.", "$5$", False),
    ("\\boxed{(1,3)}, \\boxed{(3,1)}", "$(1,3),(3,1)$", True),
    ("\\boxed{(1,3)}, \\boxed{(3,2)}", "$(1,3),(3,1)$", False),
    ("\\boxed{(3,1)}", "$(1,3),(3,1)$", False),                                # half the answer
    # a gold written as several boxes (NuminaMath / OpenR1-Math-220k style)
    ("\\boxed{-2}", "\\boxed{1} and \\boxed{-2}", False),                      # was scored right
    ("\\boxed{1}", "\\boxed{1} and \\boxed{-2}", False),
    ("\\boxed{1}, \\boxed{-2}", "\\boxed{1} and \\boxed{-2}", True),
    ("$x = \\boxed{1}$ or $x = \\boxed{-2}$", "\\boxed{1} and \\boxed{-2}", True),
    ("\\boxed{1, -2}", "\\boxed{1} and \\boxed{-2}", True),
    ("\\boxed{1}, \\boxed{2}", "\\boxed{1} and \\boxed{-2}", False),
]


@pytest.mark.parametrize("response, gold, correct", MULTI_BOX)
def test_several_boxes_are_one_answer_in_both_modes(response, gold, correct):
    assert reference(gold, response) is correct
    assert both_modes(response, gold) == (correct, correct)


def test_several_boxes_fail_on_the_last_box_alone():
    """What today's code did: the last box only, in the response and in the gold."""
    assert find_final_boxes("The solutions are \\boxed{2} and \\boxed{5}.") == ["2", "5"]
    assert prepare_gold("\\boxed{1} and \\boxed{-2}") == "1, -2"
    assert extract_answer("\\boxed{(1,3)}, \\boxed{(3,1)}") == "(1,3),(3,1)"


@pytest.mark.parametrize("response, boxes", [
    ("first \\boxed{1}, then after checking the work \\boxed{2}", ["2"]),    # words between: an earlier try
    ("<think>\\boxed{3}</think> The roots: \\boxed{1} and \\boxed{4}", ["1", "4"]),
    ("\\[\\boxed{1}\\]\n\\[\\boxed{2}\\]", ["1", "2"]),
    ("\\boxed{1} \\text{ and } \\boxed{2}", ["1", "2"]),
    ("\\boxed{\\boxed{5}}", ["5"]),
    ("\\boxed{7} and a truncated \\boxed{\\frac{1}{", ["7"]),
    ("\\boxed{1}" + " and" * 40 + " \\boxed{2}", ["2"]),                     # a long gap is not one answer
])
def test_which_boxes_form_the_final_answer(response, boxes):
    assert find_final_boxes(response) == boxes


def test_hedging_with_boxes_is_not_rewarded():
    """Boxing every candidate states a set: wrong against a one-answer gold, here and in math-verify."""
    hedge = "It is \\boxed{2} or \\boxed{3} or \\boxed{4}."
    for gold in ("2", "3", "4"):
        assert reference(f"${gold}$", hedge) is False
        assert both_modes(hedge, gold) == (False, False)


# --- item 4: grade what is reported; number spellings ------------------------------------------

SPELLINGS = [
    # (response, gold, correct). math-verify 0.9 reads these spellings otherwise (1*0, the set {2, 74},
    # 7.5*m**2): deliberate differences, listed in docs/rewards.md.
    ("The final answer is $\\boxed{1 000}$.", "1000", True),
    ("The final answer is $\\boxed{1 000}$.", "1", False),
    ("The final answer is $\\boxed{1 000}$.", "0", False),
    ("\\boxed{1 000 000}", "1000000", True),
    ("\\boxed{1 000 000}", "#### 1,000,000", True),
    ("\\boxed{1 000 001}", "1000000", False),
    ("\\boxed{2,74}", "2.74", True),
    ("\\boxed{2,74}", "2.75", False),
    ("\\boxed{2,74}", "274", False),
    ("\\boxed{0,125}", "0.125", True),                   # a leading zero: no thousands group
    ("\\boxed{1,000}", "1000", True),                    # three digits after the comma: thousands
    ("\\boxed{1,000}", "1", False),
    ("\\boxed{2.74}", "2,74", True),                     # the gold may write the comma too
    ("\\boxed{7.5 m^2}", "7.5", True),
    ("\\boxed{7.5 m^2}", "7.6", False),
    ("\\boxed{7.5\\text{ m}^2}", "7.5", True),
    ("\\boxed{5 \\text{cm}}", "5", True),
    ("The answer is 12 €.", "12", True),
    ("The answer is 12 €.", "13", False),
    ("\\boxed{\\$12}", "12", True),
    ("\\boxed{€ 12}", "12", True),
    ("\\boxed{7.5m^2}", "7.5", False),                   # no space: a product of 7.5 and m^2, as written
    ("\\boxed{3 x}", "3", False),                        # a variable is not a unit
]


@pytest.mark.parametrize("response, gold, correct", SPELLINGS)
def test_number_spellings_in_both_modes(response, gold, correct):
    assert both_modes(response, gold) == (correct, correct)


@pytest.mark.parametrize("response, gold", [
    ("The final answer is $\\boxed{1 000}$.", "1000"),
    ("\\boxed{2,74}", "2.74"),
    ("\\boxed{7.5 m^2}", "7.5"),
    ("The answer is 12 €.", "12"),
    ("The solutions are \\boxed{2} and \\boxed{5}.", "2, 5"),
    ("Final Answer: The largest $n$ is 34.", "34"),
])
def test_the_reported_answer_is_the_graded_one(response, gold):
    """When the vote key equals the gold's, the verdict is right: the key never shows a number that
    math-verify did not grade (today: extracted='1000', correct=False)."""
    result = ours(response, gold)
    assert result["extracted"] == normalize_answer(prepare_gold(gold))
    assert result["correct"] is True


def test_digits_the_grader_reads_apart_keep_apart_in_the_key():
    assert normalize_answer("2 3") == "2 3"          # math-verify: a product; the key must not say 23
    assert ours("\\boxed{2 3}", "23")["correct"] is False
    assert normalize_answer("1 000") == "1000"


def test_spelling_helpers_are_narrow():
    assert decimal_comma("2,74") == "2.74" and decimal_comma("0,125") == "0.125"
    assert decimal_comma("1,000") is None and decimal_comma("2, 74") is None and decimal_comma("(2,74)") is None
    assert strip_number_unit("7.5 m^2") == "7.5" and strip_number_unit("12 €") == "12"
    assert strip_number_unit("x m") == "x m" and strip_number_unit("7.5m") == "7.5m"
    assert strip_number_unit("5 apples") == "5 apples"
    from rlhf_ext.rewards.extraction import join_digit_groups

    assert join_digit_groups("1 000 000") == "1000000" and join_digit_groups("1 000.5") == "1000.5"
    assert join_digit_groups("1 000, 2 000") == "1000, 2000"
    assert join_digit_groups("12 34") == "12 34" and join_digit_groups("x^2 345") == "x^2 345"


def test_a_decimal_comma_is_also_read_as_a_pair():
    """``2,5`` is ambiguous (2.5, or the pair of 2 and 5, as math-verify reads it): the gold decides."""
    assert reference("$2, 5$", "\\boxed{2,5}") is True
    assert both_modes("\\boxed{2,5}", "2, 5") == (True, True)
    assert both_modes("\\boxed{2,5}", "2.5") == (True, True)
    assert both_modes("\\boxed{2,5}", "2, 6") == (False, False)
    assert both_modes("\\boxed{2,5}", "25") == (False, False)


# --- item 3: phrase anchors take the math, not the sentence ------------------------------------

PHRASES = [
    ("Final Answer: The largest $n$ is 34.", "34", True),
    ("Final Answer: The largest $n$ is 34.", "35", False),
    ("Final Answer: The largest $n$ is $34$.", "34", True),
    ("The answer is: the area is $\\frac{3}{4}$ square units.", "\\frac{3}{4}", True),
    ("The answer is: the area is $\\frac{3}{4}$ square units.", "\\frac{3}{5}", False),
    ("Answer: there are 7 ways.", "7", True),
    ("The answer is 3 and 5.", "3, 5", True),          # two numbers of one sentence: both
    ("The answer is 3 and 5.", "5", False),
    ("The answer is -3, which is negative.", "-3", True),
    ("The answer is odd.", "\\text{odd}", True),        # no math in the sentence: the sentence
    ("The answer is $x^2+1$. I hope it is correct.", "x^2+1", True),
    # more than a few words after the last number: no answer is stated (a benchmark sample that the
    # first version of the rule turned from wrong to right)
    ("Therefore, our answer is $0 + 0 = I am not sure.", "0", False),
    ("The answer is: the total is $4$, plus $x = 2$ more from the other side.", "2", False),
]


@pytest.mark.parametrize("response, gold, correct", PHRASES)
def test_phrase_anchors_in_both_modes(response, gold, correct):
    assert both_modes(response, gold) == (correct, correct)


def test_phrase_answer_is_the_math_of_the_sentence():
    cand = find_answer_candidate("Final Answer: The largest $n$ is 34.")
    assert (cand.raw, cand.source) == ("34", "phrase")
    assert reference("$34$", "Final Answer: The largest $n$ is 34.") is True


# --- item 2: answers without an anchor (evaluation mode) ---------------------------------------

NO_ANCHOR = [
    # (response, gold, correct in evaluation mode); the reference agrees on each; reward mode: wrong
    ("... so the probability that she wins is $\\frac{2}{3}$.", "\\frac{2}{3}", True),
    ("... so the probability that she wins is $\\frac{2}{3}$.", "\\frac{1}{3}", False),
    ("So she has 12 apples left.", "12", True),
    ("So she has 12 apples left.", "13", False),
    ("Adding up, we get $3 + 4 = 7$, so the total is $7$.", "7", True),
    ("Thus $x = 5$.", "5", True),
    ("Thus $x = 5$.", "6", False),
    ("So the roots are $2$ and $5$.", "2, 5", True),
    ("So the roots are $2$ and $5$.", "5", False),
    ("We find \\(\\sqrt{2}\\).", "\\sqrt{2}", True),
    ("We find \\[\\dfrac{1}{2}\\]", "0.5", True),
    ("The whole expression approaches 4/3.", "\\frac{4}{3}", True),     # a fraction in prose
    ("The whole expression approaches 4/3.", "\\frac{3}{4}", False),
]


@pytest.mark.parametrize("response, gold, correct", NO_ANCHOR)
def test_without_an_anchor_evaluation_takes_the_last_expression(response, gold, correct):
    assert reference(f"${gold}$", response) is correct
    evaluation = ours(response, gold, require_anchor=False)
    assert evaluation["correct"] is correct
    assert evaluation["extracted"] is not None
    reward = ours(response, gold, require_anchor=True)
    assert reward["correct"] is False and reward["extracted"] is None   # the reward asks for the format


def test_the_fallback_only_applies_without_an_anchor():
    text = "The answer is \\boxed{4}. Check: $2 + 2 = 4$ and then $5$."
    assert find_answer_candidate(text, require_anchor=False).source == "boxed"
    assert ours(text, "4", require_anchor=False)["correct"] is True
    assert ours(text, "5", require_anchor=False)["correct"] is False
    assert find_answer_candidate("it is odd", require_anchor=False) is None   # no math at all
    assert find_last_expression("So the angle is $\\tan 46^\\circ.$") == "\\tan 46^\\circ"  # a full stop is not math
    assert find_last_expression("costs \\$5 and \\$6 here") == "6"          # escaped dollars are not math
    assert find_last_expression("$\\begin{pmatrix}1\\\\2\\end{pmatrix}$") == "\\begin{pmatrix}1\\\\2\\end{pmatrix}"


# --- item 5: what works in a box works through the fallback --------------------------------------

CLASSES = [
    # (answer as written, gold, correct): boxed, and found by the fallback in "... is $ANSWER$."
    ("5 \\leq x", "$x \\geq 5$", True),
    ("5 < x", "$x \\geq 5$", False),
    ("[5, \\infty)", "$x \\geq 5$", True),
    ("(5, \\infty)", "$x > 5$", True),
    ("[5, \\infty)", "$x > 5$", False),
    ("\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}", "$\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$", True),
    ("\\left[\\begin{matrix} 1 & 2 \\\\ 3 & 4 \\end{matrix}\\right]",
     "$\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$", True),
    ("\\begin{bmatrix} 1 & 2 \\\\ 3 & 5 \\end{bmatrix}", "$\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$", False),
    ("\\text{odd}", "$\\text{odd}$", True),
    ("\\text{even}", "$\\text{odd}$", False),
]


@pytest.mark.parametrize("answer, gold, correct", CLASSES)
def test_answer_classes_same_in_a_box_and_through_the_fallback(answer, gold, correct):
    boxed = "So the answer is \\boxed{%s}." % answer
    bare = "So the result is $%s$." % answer
    assert reference(gold, boxed) is correct and reference(gold, bare) is correct
    assert both_modes(boxed, gold) == (correct, correct)
    assert ours(bare, gold, require_anchor=False)["correct"] is correct
    assert ours(bare, gold, require_anchor=True)["correct"] is False


# --- what already held: bounded on hostile text, the pool agrees with the per-sample path -------

@pytest.mark.parametrize("hostile", [
    "$" * 200_000,
    "\\boxed{1} and " * 20_000,
    "\\(" * 100_000 + "1",
    "The answer is " + "a $x$ " * 30_000,
    "1 " * 100_000,
    "\\boxed{" * 50_000 + "}" * 10,
])
def test_hostile_text_is_scanned_in_bounded_time(hostile):
    t0 = time.perf_counter()
    for require_anchor in (True, False):
        find_answer_candidate(hostile, require_anchor=require_anchor)
        extract_answer(hostile, require_anchor=require_anchor)
    prepare_gold(hostile)
    assert time.perf_counter() - t0 < 2.0


def test_a_final_answer_of_many_parts_stays_bounded():
    from rlhf_ext.rewards.extraction import MAX_ANSWER_CHARS

    many = " ".join("\\boxed{%d}" % i for i in range(5000))
    raw = find_answer_candidate(many).raw
    assert len(raw) <= MAX_ANSWER_CHARS and raw.count(",") == 31 and raw.endswith("4999")
    prose = " and ".join(str(i) for i in range(5000))
    assert find_last_expression(prose).count(",") == 31
    assert find_answer_candidate("\\boxed{7}\\boxed{7}").raw == "7"     # the same box twice: one element
    assert ours("\\boxed{7}\\boxed{8}", "8")["correct"] is False          # two different boxes: a set


def test_require_anchor_is_checked_and_survives_pickling():
    with pytest.raises(ValueError, match="require_anchor"):
        MathGrader(require_anchor="no")
    grader = MathGrader(require_anchor=False)
    try:
        copy = pickle.loads(pickle.dumps(grader))
        assert copy.require_anchor is False
        copy.close()
        assert MathGrader().require_anchor is True   # rewards keep the anchor
    finally:
        grader.close()


def test_pool_agrees_with_the_per_sample_path_in_both_modes():
    cases = [(r, g) for r, g, _ in MULTI_BOX[:6] + SPELLINGS[:8] + PHRASES[:4] + NO_ANCHOR[:6]]
    for require_anchor in (True, False):
        with MathGrader(timeout=30.0, workers=2, require_anchor=require_anchor) as grader:
            batch = grader.grade_batch([r for r, _ in cases], [g for _, g in cases])
            single = [grader.grade(r, g) for r, g in cases[:5]]
        for (response, gold), got in zip(cases, batch):
            want = ours(response, gold, require_anchor)
            assert (got.correct, got.extracted, got.gold_parsed) == (want["correct"], want["extracted"], True), response
            assert got.error is None
        assert [(s.correct, s.extracted) for s in single] == [(b.correct, b.extracted) for b in batch[:5]]


def test_rewards_still_require_the_anchor():
    from rlhf_ext.rewards import default_grader

    assert default_grader().require_anchor is True


# --- evalkit and data sample: the choice is recorded and kept ----------------------------------

def test_evalkit_flag_default_and_resume(tmp_path):
    import json

    from rlhf_ext.evalkit.commands.evaluate import parser as _run_parser, run_options as _options

    parse_args = _run_parser("math500", "").parse_args
    assert _options("math500", parse_args(["--model", "m"])).require_anchor is False
    assert _options("math500", parse_args(["--model", "m", "--require-anchor"])).require_anchor is True
    run = tmp_path / "run"
    run.mkdir()
    base = {"suite": "math500", "generation": {"model": "m"}, "engine": {}, "datasets": {}}
    (run / "config.json").write_text(json.dumps(base))   # written before the option: anchor required
    args = parse_args(["--resume", "--output", str(run)])
    assert _options("math500", args).require_anchor is True
    (run / "config.json").write_text(json.dumps({**base, "grading": {"require_anchor": False}}))
    assert _options("math500", args).require_anchor is False


def test_evalkit_refuses_to_mix_grading_modes(tmp_path):
    import json

    from rlhf_ext.evalkit.records import RunDirError
    from rlhf_ext.evalkit.runner import RunOptions
    from rlhf_ext.evalkit.resume import check_existing as _check_existing

    (tmp_path / "config.json").write_text(json.dumps({"suite": "math500", "generation": {},
                                                      "grading": {"require_anchor": True}}))
    run = SimpleNamespace(output=tmp_path, generation={}, options=RunOptions(suite="math500", model="m"))
    with pytest.raises(RunDirError, match="require_anchor=True"):
        _check_existing(run, [{"problem_id": "p"}])
    run.options = RunOptions(suite="math500", model="m", require_anchor=True)
    _check_existing(run, [{"problem_id": "p"}])


def test_summary_says_how_answers_were_found():
    from rlhf_ext.evalkit.summary import render_markdown, summarize

    config = {"suite": "t", "tasks": ["t"], "n_samples": 1, "datasets": {"t": {"problem_ids": ["p"]}},
              "generation": {"model": "m", "template": "r1", "temperature": 0.6, "top_p": 0.95,
                             "max_tokens": 8, "seed": 0},
              "statistics": {"bootstrap_resamples": 100}, "grading": {"require_anchor": False}}
    record = {"task": "t", "problem_id": "p", "sample_index": 0, "correct": True, "extracted": "1",
              "truncated": False, "response_tokens": 3, "gold_parsed": True, "grade_timeout": False,
              "grade_error": None, "response": "$1$", "gold": "1"}
    summary = summarize([record], config)
    assert summary["require_anchor"] is False
    assert "last math expression" in render_markdown(summary)
    config["grading"] = {"require_anchor": True}
    assert "anchor" in render_markdown(summarize([record], config))
    del config["grading"]
    assert summarize([record], config)["require_anchor"] is True


def test_data_sample_flag():
    import argparse

    from rlhf_ext.data.cli import add_data_commands

    parser = argparse.ArgumentParser()
    add_data_commands(parser.add_subparsers())
    args = parser.parse_args(["sample", "--model", "m", "--data", "d.jsonl", "--output", "o"])
    assert args.require_anchor is None
    args = parser.parse_args(["sample", "--model", "m", "--data", "d.jsonl", "--output", "o", "--require-anchor"])
    assert args.require_anchor is True


def test_compare_notes_runs_graded_two_ways(tmp_path):
    import json

    from rlhf_ext.evalkit.summary import compare_runs, render_compare_markdown

    def run(path, require_anchor):
        path.mkdir()
        config = {"suite": "t", "tasks": ["t"], "n_samples": 1, "status": "complete",
                  "datasets": {"t": {"problem_ids": ["p"], "sha256": "s" * 64}},
                  "generation": {"model": "m", "template": "r1", "temperature": 0.6, "top_p": 0.95,
                                 "max_tokens": 8, "seed": 0}, "statistics": {"bootstrap_resamples": 100}}
        if require_anchor is not None:
            config["grading"] = {"require_anchor": require_anchor}
        (path / "config.json").write_text(json.dumps(config))
        record = {"task": "t", "problem_id": "p", "sample_index": 0, "correct": True, "extracted": "1",
                  "truncated": False, "response_tokens": 3, "gold_parsed": True, "grade_timeout": False,
                  "grade_error": None}
        (path / "samples.jsonl").write_text(json.dumps(record) + "\n")
        return path

    old, new, new2 = run(tmp_path / "old", None), run(tmp_path / "new", False), run(tmp_path / "new2", False)
    result = compare_runs([old, new, new2], resamples=100)
    assert result["comparisons"][0]["grading_differs"] == {"baseline_require_anchor": True,
                                                           "run_require_anchor": False}
    assert "grading_differs" not in compare_runs([new, new2], resamples=100)["comparisons"][0]
    assert "part of the difference is the grading" in render_compare_markdown(result)
