"""The answer search's and the fast path's shortcuts equal the plain definitions they stand for (issue 41).

OpenRLHF calls the reward once per sample; each shortcut below saves a few microseconds of that call
(benchmarks/rewards_per_call.py) and must never change what is found or decided:

* a box whose content has no brace or backslash closes at the first ``}``, without matching every
  brace of the text; other boxes match braces from the first box on, not from the text's start;
* the last "the answer is" phrase is searched from the end of a lower-cased copy, not by running the
  case-insensitive regex over the whole response;
* a plain integer answer against an integer gold is decided without the grader's rewriting passes.

Each is checked against the definition it replaces, written out here (the whole-text brace matching,
``ANSWER_PHRASE.finditer``, the general verdict), on generated texts built from the pieces that matter
(braces, escaped braces and backslashes, boxes, answer phrases in any case, the characters that
Python's IGNORECASE folds to ASCII letters, whitespace runs) and on hand cases.
"""

import re
from fractions import Fraction
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_ext.rewards import answer_finding as af
from rlhf_ext.rewards import exact_numbers as en
from rlhf_ext.rewards.answer_finding import ANSWER_PHRASE

_PIECES = ["{", "}", "\\{", "\\}", "\\\\", "\\", "\\boxed{", "\\boxed ", "\\fbox{", "\\frac{1}{2}", "x", "7",
           " ", "\n", "\t", "$", "answer", "Answer", "ANSWER", "AnSwEr", "final", "Final ", "final\n\n",
           "is", " is ", ":", "answer is 5", "Final answer: 3", "the final  answer is $4$",
           "\u017f", "\u212a", "\u0130", "\u0131", "an\u017fwer is 9", "\u00e9", "_", "finalanswer is 2",
           "x_final answer is 6", ".", "answers: 4", "answer:", "ANSWER IS 8"]
texts = st.lists(st.sampled_from(_PIECES), max_size=24).map("".join)


def _boxes_by_whole_text_matching(text):
    """The definition: every brace of the text matched from its start (the shortcut off), boxes read off."""
    whole = af._matching_braces
    with mock.patch.object(af, "_plain_close", lambda text, start: None), \
            mock.patch.object(af, "_matching_braces", lambda text, start=0: whole(text)):
        return af._complete_boxes(text)


def _last_phrase_by_regex(text):
    last = None
    for last in ANSWER_PHRASE.finditer(text):
        pass
    return None if last is None else last.span()


@settings(max_examples=600, deadline=None, derandomize=True, database=None)
@given(texts)
def test_boxes_equal_whole_text_brace_matching(text):
    assert af._complete_boxes(text) == _boxes_by_whole_text_matching(text)


@settings(max_examples=600, deadline=None, derandomize=True, database=None)
@given(texts)
def test_the_last_answer_phrase_equals_the_regex_run_over_the_whole_text(text):
    assert af._last_phrase_match(text) == _last_phrase_by_regex(text)


@pytest.mark.parametrize("text, span", [
    ("So the answer is 5.", (7, 17)),
    ("The Final Answer: 7", (4, 18)),
    ("final  \n answer is 3", (0, 19)),
    ("xfinal answer is 3", (7, 17)),            # no word boundary before "final": the match starts at "answer"
    ("The answer is 2. No, the ANSWER IS 4", (25, 35)),
    ("the answer was 4; answers: 3", None),     # "answers" is no "answer" followed by is/:
    ("an\u017fwer is 9", (0, 10)),                # long s: IGNORECASE reads it as s, and so does the search
    ("\u212aaNSWER", None),
    ("", None),
])
def test_last_answer_phrase_hand_cases(text, span):
    assert af._last_phrase_match(text) == span == _last_phrase_by_regex(text)


def test_the_shortcut_only_skips_text_that_cannot_change_the_match():
    # every character that IGNORECASE matches to an ASCII letter besides its own cases sends the search
    # to the regex (Python's documented list; this checks it against the re module on every code point)
    import string

    folded = [chr(c) for c in range(0x80, 0x110000) if re.fullmatch("(?i)[a-z]", chr(c))]
    assert sorted(folded) == sorted(af._FOLDED_TO_ASCII)
    lowered_to_ascii = [chr(c) for c in range(0x80, 0x110000) if chr(c).lower() in set(string.ascii_letters)]
    assert set(lowered_to_ascii) <= set(af._FOLDED_TO_ASCII)


@pytest.mark.parametrize("text, contents", [
    ("So \\boxed{17}.", ["17"]),
    ("\\boxed{\\frac{1}{2}} and then \\boxed{3}", ["\\frac{1}{2}", "3"]),
    ("{ \\boxed{5} }", ["5"]),                   # an outer brace opened before the box does not matter
    ("} \\boxed{5}", ["5"]),
    ("\\boxed{a\\}b}", ["a\\}b"]),                 # an escaped brace inside is no brace: the next closes it
    ("\\\\boxed{5}", ["5"]),                      # a line break, then "boxed": still a box
    ("\\boxed{ } \\boxed{4}", ["4"]),
    ("\\boxed{" + "x" * 2500 + "} \\boxed{7}", ["7"]),  # a box longer than an answer: past the bounded search
    ("\\boxed{" * 50 + "5}", ["5"]),
    ("\\boxed{" + "x" * 1990 + "{y}" + "x" * 20 + "} and \\boxed{8}", ["8"]),
])
def test_box_hand_cases(text, contents):
    assert [c for _, _, c in af._complete_boxes(text)] == contents
    assert af._complete_boxes(text) == _boxes_by_whole_text_matching(text)


def _decide_without_the_integer_lane(gold_text, raw):
    with mock.patch.object(en, "_PLAIN_INTEGER", re.compile(r"(?!)")):
        return en._decide.__wrapped__(gold_text, raw)


golds = st.one_of(st.integers(-10 ** 20, 10 ** 20).map(str), st.integers(-9, 9).map(str), st.sampled_from(
    ["\\frac{4}{2}", "50\\%", "0.5", "2.0", "-0", "1,000", "3\\sqrt{2}", "\\pi", "(1,2)", "x+1", "025", "7"]))
answers = st.one_of(st.integers(-10 ** 19, 10 ** 19).map(str), st.integers(-9, 9).map(str),
                    st.sampled_from(["0", "-0", "007", "2", "50", "1000", "-7", "+7", "12345678901234567890"]))


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(golds, answers)
def test_the_integer_lane_equals_the_general_verdict(gold, raw):
    from rlhf_ext.rewards import prepare_gold

    gold_text = prepare_gold(gold)
    assert en._decide.__wrapped__(gold_text, raw) == _decide_without_the_integer_lane(gold_text, raw)


def test_the_integer_lane_hand_cases():
    assert en._PLAIN_INTEGER.fullmatch("104") and en._PLAIN_INTEGER.fullmatch("-3")
    for written in ("007", "-0", "+7", "1,000", "10" * 10):
        assert not en._PLAIN_INTEGER.fullmatch(written)  # left to the general reading
    assert en._decide.__wrapped__("104", "104") == (True, "104")
    assert en._decide.__wrapped__("104", "-104") == (False, "-104")
    assert en._decide.__wrapped__("\\frac{4}{2}", "2") == (True, "2")
    assert en.gold_value("50\\%").percent and en._decide.__wrapped__("50\\%", "50")[0] is True
    assert en.gold_value("7").value == Fraction(7)
