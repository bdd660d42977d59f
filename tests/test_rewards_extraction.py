"""Answer extraction and normalization: every rule, gold formats of the real benchmark files, and
hostile text (linear-time scans, nothing evaluated)."""

import json
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_ext.rewards import extract_answer, find_answer_candidate, normalize_answer, prepare_gold
from rlhf_ext.rewards.extraction import find_last_boxed

DATA = os.path.join("..", "shared", "data")


def _rows(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),  # nested braces
        ("first \\boxed{1}, then \\boxed{2}", "2"),  # the last one
        ("\\boxed{7} and a truncated \\boxed{\\frac{1}{", "7"),  # unclosed boxed skipped
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are literal
        ("\\fbox{42}", "42"),
        ("the answer is \\boxed 5", "5"),
        ("\\boxed {3}", "3"),
    ],
)
def test_boxed_content(text, expected):
    assert find_last_boxed(text) == expected


@pytest.mark.parametrize(
    "text, raw, source",
    [
        ("<think>\nhmm\n</think>\n<answer>\n42\n</answer>", "42", "answer_tag"),
        ("<answer> The answer is $\\frac{3}{4}$. </answer>", "\\frac{3}{4}", "answer_tag"),
        ("<answer>\\boxed{9}</answer>", "9", "boxed"),  # boxed wins over the tag
        ("Thus, the answer is 42.", "42", "phrase"),
        ("The final answer is $x^2+1$. I hope it is correct.", "x^2+1", "phrase"),
        ("Answer: 17", "17", "phrase"),
        ("the answer is 42 apples.", "42", "phrase"),  # a number with a unit word
        ("the answer is: **12**", "12", "phrase"),
        ("Natalia sold 48 clips.\n#### 72", "72", "gsm8k"),
        ("The answer is 5.\n#### 6", "6", "gsm8k"),  # whichever comes last
        ("#### 6\nSo the answer is 7", "7", "phrase"),
        ("The answer is 3.5 here", "3.5", "phrase"),  # a decimal point is not a sentence end
    ],
)
def test_answer_candidate_rules(text, raw, source):
    cand = find_answer_candidate(text)
    assert cand is not None and (cand.raw, cand.source) == (raw, source)


@pytest.mark.parametrize("text", ["", "no answer here", "\\boxed{}", "<answer></answer>", "the answer isn't clear",
                                  "\\boxed{unclosed"])
def test_no_answer(text):
    assert extract_answer(text) is None


@pytest.mark.parametrize(
    "raw, key",
    [
        ("025", "25"),  # AIME golds
        ("27.0", "27"),  # AMC golds
        ("0.5", "1/2"),
        ("\\frac{1}{2}", "1/2"),
        ("\\dfrac12", "1/2"),
        ("1/2", "1/2"),
        ("-\\frac{2}{4}", "-1/2"),
        ("1,000", "1000"),
        ("$ 3 $", "3"),
        ("x = 3", "3"),
        ("90^\\circ", "90"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("\\text{(C)}", "(C)"),
        ("x \\rightarrow 0", "x\\rightarrow0"),  # \right inside \rightarrow untouched
        ("\\frac{1}{0}", "\\frac{1}{0}"),  # no division by zero, left as written
        ("a=1, b=2", "a=1,b=2"),  # two assignments are not one
    ],
)
def test_normalize(raw, key):
    assert normalize_answer(raw) == key


def test_equivalent_spellings_share_a_vote_key():
    spellings = ["\\boxed{\\frac{1}{2}}", "The answer is 0.5.", "<answer>1/2</answer>", "#### 0.50",
                 "\\boxed{\\dfrac12}", "\\boxed{\\tfrac{1}{2}}"]
    assert {extract_answer(s) for s in spellings} == {"1/2"}
    assert extract_answer("\\boxed{025}") == extract_answer("\\boxed{25}") == "25"
    assert extract_answer("\\boxed{27.0}") == extract_answer("\\boxed{27}")


@pytest.mark.parametrize(
    "gold, expected",
    [
        ("Janet sells 9 eggs.\n#### 18", "18"),
        ("... #### 1,234", "1234"),
        ("We get $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("$\\frac{\\pi}{2}$", "\\frac{\\pi}{2}"),
        ("025", "025"),
        (27.0, "27.0"),
        (70, "70"),
        ("  ", None),
        (None, None),
        (True, None),
        (float("nan"), None),
        ({"answer": 3}, None),
        ("#### ", None),
    ],
)
def test_prepare_gold(gold, expected):
    assert prepare_gold(gold) == expected


def test_benchmark_golds_all_have_an_answer():
    for name, key in (("gsm8k_test.jsonl", "answer"), ("math500.jsonl", "answer"), ("aime24.jsonl", "answer"),
                      ("aime25.jsonl", "answer"), ("amc23.jsonl", "answer")):
        rows = _rows(name)
        assert rows, name
        prepared = [prepare_gold(r[key]) for r in rows]
        assert all(p for p in prepared), name
    gsm = _rows("gsm8k_test.jsonl")
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", prepare_gold(r["answer"])) for r in gsm)
    amc = _rows("amc23.jsonl")
    assert all(isinstance(r["answer"], float) for r in amc)
    assert {extract_answer("\\boxed{%s}" % prepare_gold(r["answer"])) for r in amc} == \
        {normalize_answer(str(int(r["answer"]))) if r["answer"].is_integer() else normalize_answer(repr(r["answer"]))
         for r in amc}


@pytest.mark.parametrize(
    "hostile",
    [
        "\\boxed{" * 200_000,  # many unclosed boxes: brace matching is one pass
        "<answer>" * 100_000 + "x</answer>",  # many unclosed tags: rfind, not a lazy regex
        "The answer is " * 50_000,
        "{" * 300_000 + "}" * 300_000,
        "#### " * 100_000,
        "answer" + " " * 500_000 + "is 5",
        "\\boxed{" + "{" * 100_000 + "1" + "}" * 100_001,  # over-long answer is not an answer
    ],
)
def test_hostile_text_is_handled(hostile):
    out = extract_answer(hostile)
    assert out is None or isinstance(out, str)
    assert find_answer_candidate(hostile) is None or len(find_answer_candidate(hostile).raw) <= 2000


def test_code_in_answers_is_only_text():
    payload = "__import__('os').system('echo pwned')"
    for text in ("\\boxed{%s}" % payload, "<answer>%s</answer>" % payload, "The answer is %s" % payload,
                 "#### %s" % payload):
        out = extract_answer(text)
        assert "__import__" in out and "system" in out  # returned as a string, nothing ran


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("\\boxed{}$answeris:#<>/ 0123456789.,-\n")), max_size=80))
def test_extract_never_raises_and_normalization_is_idempotent(text):
    key = extract_answer(text)
    if key is not None:
        assert normalize_answer(key) == key


@settings(max_examples=200, deadline=None)
@given(st.fractions(min_value=-1000, max_value=1000, max_denominator=50))
def test_numbers_in_any_spelling_share_a_key(value):
    as_frac = ("-" if value < 0 else "") + "\\frac{%d}{%d}" % (abs(value.numerator), value.denominator)
    as_slash = ("-" if value < 0 else "") + "%d/%d" % (abs(value.numerator), value.denominator)
    assert normalize_answer(as_frac) == normalize_answer(as_slash)
    if value.denominator == 1:
        assert normalize_answer(as_frac) == str(value.numerator) == normalize_answer("%d.000" % value.numerator)
