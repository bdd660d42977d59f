"""Choice and ranking answers: the gold format, every extraction form with its wrong twin, Kendall's
tau by hand, and the registered rewards alone and in weighted specs (issue 25)."""

import json

import pytest

from rlhf_ext.rewards import (ChoiceGrade, GoldFormatError, WeightedReward, extract_choice, extract_ranking,
                              get_reward, grade_mixed, kendall_tau, parse_options, parse_structured_gold,
                              ranking_partial_score)
from rlhf_ext.rewards.choice import grade_structured, map_grade_labels, shuffled_gold

FOUR = parse_options(["Paris", "London", "Rome", "Berlin"])  # A..D
THREE = parse_options({"A": "config one", "B": "config two", "C": "config three"})

# (text, expected label): each form of the issue, answered B
CHOICE_FORMS = [
    ("B", "B"),
    ("(B)", "B"),
    ("**B**", "B"),
    ("\\boxed{B}", "B"),
    ("Answer: B", "B"),
    ("the answer is option B", "B"),
    ("The answer is London.", "B"),  # the option's text
    ("The final answer is $\\boxed{\\text{B}}$.", "B"),
    ("<think>\nA looks good, maybe C\n</think>\n<answer>\nB\n</answer>", "B"),
    ("Option A is tempting and C is cheap, but the answer is (B).", "B"),  # the anchor wins over letters
    ("We compare A and C first. \\boxed{B}", "B"),
    ("The answer is B because London is larger.", "B"),
    ("Answer: b", "B"),
    ("B. London", "B"),
]


@pytest.mark.parametrize("text,label", CHOICE_FORMS)
def test_each_choice_form(text, label):
    p = extract_choice(text, FOUR)
    assert (p.status, p.label) == ("ok", label), p


# the wrong twin of each form: (text, status)
CHOICE_TWINS = [
    ("E", "invalid"),  # a bare label not among A-D
    ("(E)", "invalid"),
    ("**E**", "invalid"),
    ("\\boxed{E}", "invalid"),
    ("Answer: E", "invalid"),
    ("the answer is option E", "invalid"),
    ("The answer is Madrid.", "unparseable"),  # no option has that text
    ("\\boxed{A} and \\boxed{C}", "ambiguous"),  # two picks in the final answer
    ("Answer: A or C", "ambiguous"),
    ("<answer>\nA, C\n</answer>", "ambiguous"),
    ("Option A is tempting and C is cheap.", "unparseable"),  # letters in reasoning are no answer
    ("A is my first guess, so let me check.", "unparseable"),  # prose starting with a label is no answer
    ("\\boxed{42}", "unparseable"),
    ("", "unparseable"),
]


@pytest.mark.parametrize("text,status", CHOICE_TWINS)
def test_each_choice_wrong_twin(text, status):
    p = extract_choice(text, FOUR)
    assert (p.status, p.label) == (status, None), p


def test_choice_anchor_rule_follows_require_anchor():
    text = "Let me think about Paris and Rome.\n(C)"
    assert extract_choice(text, FOUR).status == "unparseable"  # no anchor: the rewards' rule
    p = extract_choice(text, FOUR, require_anchor=False)  # evaluation: the last line when it is an answer
    assert (p.status, p.label, p.source) == ("ok", "C", "last_line")


RANKING_FORMS = [
    "C > A > B",
    "C, A, B",
    "1. C 2. A 3. B",
    "Final ranking:\n1. C\n2. A\n3. B",
    "\\boxed{C > A > B}",
    "\\boxed{C \\succ A \\succ B}",
    "The answer is C > A > B.",
    "<answer>\nC; A; B\n</answer>",
    "I first thought A > B > C. Answer: C > A > B",  # the anchor wins over a ranking in the reasoning
    "config three > config one > config two",  # by option texts
]


@pytest.mark.parametrize("text", RANKING_FORMS)
def test_each_ranking_form(text):
    r = extract_ranking(text, THREE)
    assert (r.status, r.order) == ("ok", ("C", "A", "B")), r


RANKING_TWINS = [
    ("C > A > C", "invalid", "repeats C"),
    ("C, A", "invalid", "misses B"),
    ("1. C 2. D 3. A 4. B", "invalid", "'D' is not one of"),
    ("Final ranking:\n1. C\n2. A", "invalid", "misses B"),
    ("\\boxed{C > A > B > A}", "invalid", "repeats A"),
    ("\\boxed{C > A > B} or \\boxed{A > C > B}", "ambiguous", ""),
    ("The answer is C > A > B or A > C > B.", "ambiguous", ""),
    ("I cannot decide.", "unparseable", ""),
    ("The answer is C > foo > B.", "unparseable", ""),
]


@pytest.mark.parametrize("text,status,detail", RANKING_TWINS)
def test_each_ranking_wrong_twin(text, status, detail):
    r = extract_ranking(text, THREE)
    assert (r.status, r.order) == (status, None), r
    assert detail in r.detail


def test_gold_forms_and_errors():
    g = parse_structured_gold({"options": ["x", "y", "z"], "answer": "B"})
    assert (g.answer_type, g.options.labels, g.answer) == ("choice", ("A", "B", "C"), ("B",))
    g = parse_structured_gold(json.dumps({"options": {"P": "x", "Q": "y"}, "answer": ["Q", "P"]}))
    assert (g.answer_type, g.answer) == ("ranking", ("Q", "P"))
    assert parse_structured_gold(g.as_label()) == g  # round trip through the JSON label
    assert parse_structured_gold({"answer_type": "ranking", "options": ["x", "y"], "answer": "B > A"}).answer == \
        ("B", "A")
    assert parse_structured_gold("\\frac{1}{2}") is None and parse_structured_gold("{1, 2}") is None  # math golds
    for bad, message in [({"options": ["x", "y"], "answer": "C"}, "not one of the option labels"),
                         ({"options": ["x", "y", "z"], "answer": ["A", "B"]}, "must name each"),
                         ({"options": ["x", "y"], "answer": ["A", "A"]}, "must name each"),
                         ({"options": ["x"], "answer": "A"}, "at least 2 options"),
                         ({"options": {"A": "x", "a": "y"}, "answer": "A"}, "differ only in case"),
                         ({"answer_type": "vote", "options": ["x", "y"], "answer": "A"}, "answer_type must be")]:
        with pytest.raises(GoldFormatError, match=message):
            parse_structured_gold(bad)


def test_kendall_tau_by_hand():
    gold = ["C", "A", "B"]
    assert kendall_tau(["C", "A", "B"], gold) == 1.0
    assert kendall_tau(["B", "A", "C"], gold) == -1.0
    # A C B against C A B: pairs (C,A) discordant, (C,B) and (A,B) concordant: (2 - 1) / 3
    assert kendall_tau(["A", "C", "B"], gold) == pytest.approx(1 / 3)
    # 4 items, one adjacent swap: (5 - 1) / 6
    assert kendall_tau(list("ABDC"), list("ABCD")) == pytest.approx(4 / 6)
    assert ranking_partial_score(["A", "C", "B"], gold) == pytest.approx(0.5 * (2 / 3) + 0.5 * 0)
    assert ranking_partial_score(["C", "B", "A"], gold) == pytest.approx(0.5 * (2 / 3) + 0.5 * 1)
    assert ranking_partial_score(["C", "B", "A"], gold, top1_weight=0.0) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        kendall_tau(["A", "B"], gold)


CHOICE_GOLD = {"options": ["Paris", "London", "Rome", "Berlin"], "answer": "B"}
RANK_GOLD = {"options": {"A": "config one", "B": "config two", "C": "config three"}, "answer": ["C", "A", "B"]}


def test_rewards_by_hand():
    texts = ["\\boxed{B}", "Answer: C", "Answer: E", "\\boxed{C > A > B}", "\\boxed{C > B > A}",
             "\\boxed{A > C > B}", "C > A", "no idea"]
    golds = [CHOICE_GOLD] * 3 + [RANK_GOLD] * 5
    assert get_reward("choice_accuracy")(texts, golds) == [1, 0, 0, 1, 1, 0, 0, 0]
    assert get_reward("ranking_exact")(texts, golds) == [1, 0, 0, 1, 0, 0, 0, 0]
    partial = get_reward("ranking_partial")(texts, golds)
    # C B A: tau 1/3 -> 0.5 * 2/3 + 0.5 (top-1 right); A C B: tau 1/3 -> 0.5 * 2/3
    assert partial == pytest.approx([1, 0, 0, 1, 1 / 3 + 0.5, 1 / 3, 0, 0])
    assert get_reward("ranking_partial")(texts, golds, top1_weight=1.0) == pytest.approx([1, 0, 0, 1, 1, 0, 0, 0])
    assert get_reward("parse_failure")(texts, golds) == [0, 0, 1, 0, 0, 0, 1, 1]


def test_weighted_spec_mixes_answer_types_and_flags():
    texts = ["\\boxed{B}", "Answer: A or B", "\\boxed{C > B > A}", "The answer is \\boxed{4}.", "\\boxed{B}"]
    golds = [CHOICE_GOLD, json.dumps(CHOICE_GOLD), RANK_GOLD, "4", {"options": ["x", "y"], "answer": "Z"}]
    with WeightedReward("choice_accuracy:1.0,ranking_partial:0.5,parse_failure:-0.5,format:0.1,truncation:-0.5",
                        workers=1) as reward:
        out = reward(texts, golds, truncated=[False, False, False, False, True])
    assert out.components["choice_accuracy"] == [1, 0, 1, 1, 0]
    assert out.components["ranking_partial"] == pytest.approx([1, 0, 1 / 3 + 0.5, 1, 0])
    assert out.components["parse_failure"] == [0, 1, 0, 0, 0]  # a bad gold is the data's failure, not a parse failure
    assert out.rewards == pytest.approx([1.5, -0.5, 1 + 0.5 * (1 / 3 + 0.5), 1.5, -0.5])
    assert out.correct == [1, 0, 0, 1, 0]  # the ranking's exact order was wrong
    assert out.flags["no_answer"] == [0, 1, 0, 0, 1]
    assert out.flags["gold_unparsed"] == [0, 0, 0, 0, 1]
    assert isinstance(out.grades[0], ChoiceGrade) and out.grades[4].status == "bad_gold"
    with WeightedReward("choice") as preset, WeightedReward("ranking") as ranking:
        assert preset(["(B)"], [CHOICE_GOLD]).rewards == [1.0]
        assert ranking(["C > A > C"], [RANK_GOLD]).rewards == [-0.5]


def test_grade_mixed_calls_the_math_grader_only_for_math_golds():
    calls = []

    class Refuse:
        def grade_batch(self, texts, golds):
            calls.append(golds)
            raise AssertionError("no math gold in this batch")

    grades = grade_mixed(["B", "C > A > B"], [CHOICE_GOLD, RANK_GOLD], lambda: Refuse())
    assert [g.correct for g in grades] == [True, True] and calls == []


def test_shuffled_gold_maps_answers_back():
    gold = parse_structured_gold(RANK_GOLD)
    shown, mapping = shuffled_gold(gold, [2, 0, 1])  # shown A = config three, B = config one, C = config two
    assert shown.options.texts == ("config three", "config one", "config two")
    assert shown.answer == ("A", "B", "C") and mapping == {"A": "C", "B": "A", "C": "B"}
    g = grade_structured("\\boxed{A > C > B}", shown)  # config three > config two > config one
    assert (g.correct, g.top1, g.extracted) == (False, True, "A>C>B")
    assert map_grade_labels(g, mapping).extracted == "C>B>A"


@pytest.mark.parametrize("text", [
    "<answer>" + " " * 200_000 + "</answer>",
    "Answer: " + "A > " * 50_000,
    "\\boxed{" + "(" * 100_000 + "}",
    " " * 100_000 + "or" + " " * 100_000,
    "1. " * 100_000,
    "<answer>" * 50_000 + "B",
])
def test_hostile_text_is_read_without_error(text):
    for parse in (lambda: extract_choice(text, FOUR), lambda: extract_ranking(text, THREE),
                  lambda: extract_choice(text, FOUR, require_anchor=False)):
        assert parse().status in ("ok", "unparseable", "ambiguous", "invalid")


def test_mindspeed_rl_verifier_entries_take_the_new_rewards():
    """MindSpeed-RL's ``rlhf_ext:SPEC`` verifier entries: validated at start-up, scored with a JSON label."""
    from rlhf_ext.patches.mindspeed_rl.config import check_verifiers
    from rlhf_ext.patches.mindspeed_rl.rewards import rlhf_ext_scores

    assert check_verifiers(["rlhf_ext:choice_accuracy:1.0,parse_failure:-0.5", "rlhf_ext:ranking"], None) == \
        ["choice_accuracy:1.0,parse_failure:-0.5", "ranking"]
    scores, metrics = rlhf_ext_scores("ranking", ["\\boxed{C > B > A}", "\\boxed{C}"],
                                      [json.dumps(RANK_GOLD)] * 2, None)
    assert scores == pytest.approx([1 / 3 + 0.5, -0.5])
    assert metrics["reward/parse_failure"] == [0.0, 1.0]


def test_a_ranking_gold_without_options_takes_them_from_its_answer():
    # issue 41: a ranking orders every option, so its answer names them all; every response used to be
    # graded wrong (the gold was refused for want of 'options')
    for gold in [{"answer": ["C", "A", "B"]}, {"answer_type": "ranking", "answer": "C > A > B"},
                 json.dumps({"answer": ["C", "A", "B"]}),
                 json.dumps({"answer_type": "ranking", "answer": ["C", "A", "B"]})]:
        g = parse_structured_gold(gold)
        assert (g.answer_type, g.options.labels, g.answer) == ("ranking", ("A", "B", "C"), ("C", "A", "B")), gold
        assert parse_structured_gold(g.as_label()) == g  # the label a run records reads back the same
    with WeightedReward("ranking_partial:1.0,parse_failure:-0.5", workers=1) as reward:
        out = reward(["\\boxed{C > A > B}", "Final ranking: A > C > B", "\\boxed{C > A}", "\\boxed{C > A > D}"],
                     [{"answer": ["C", "A", "B"]}] * 4)
    # right; one adjacent swap (tau 1/3, pick wrong); misses B; D is no option -- the same as with options
    assert out.correct == [1, 0, 0, 0]
    assert out.components["ranking_partial"] == pytest.approx([1.0, 0.5 * (2 / 3), 0, 0])
    assert out.components["parse_failure"] == [0, 0, 1, 1]
    assert [g.status for g in out.grades] == ["ok", "ok", "invalid", "invalid"]
    # what still needs options, or is no choice gold at all
    for bad, message in [({"answer": ["C", "A", "C"]}, "repeats C"), ({"answer_type": "choice", "answer": "B"},
                                                                        "choice gold needs 'options'"),
                         ({"answer": ["C"]}, "at least 2 options"), ({"answer_type": "ranking"}, "needs an 'answer'")]:
        with pytest.raises(GoldFormatError, match=message):
            parse_structured_gold(bad)
    assert parse_structured_gold('{"answer": "42"}') is None and parse_structured_gold({"answer": "42"}) is None
