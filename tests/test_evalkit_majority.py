"""Issue 17, item 4: maj@n votes over answers, not spellings (the grader's own equivalence, cached).

Hand-counted problems: equivalent spellings of the right answer that used to split their votes
and lose to one wrong answer; ties still split the credit; abstentions still abstain.
"""

import pytest

from rlhf_ext.evalkit import AnswerEquivalence, cluster_answers, majority_vote
from rlhf_ext.evalkit.summary import summarize
from rlhf_ext.rewards import MathGrader, extract_answer


@pytest.fixture(scope="module")
def equivalence():
    with MathGrader(timeout=10, workers=2) as g:
        yield AnswerEquivalence(g)


def _records(responses, gold_correct, pid="p0"):
    return [{"task": "t", "problem_id": pid, "sample_index": i, "response": r, "extracted": extract_answer(r),
             "correct": ok, "truncated": False, "response_tokens": 10, "gold_parsed": True, "grade_timeout": False,
             "grade_error": None} for i, (r, ok) in enumerate(zip(responses, gold_correct))]


def _config(ids):
    return {"suite": "t", "tasks": ["t"], "n_samples": 8, "datasets": {"t": {"problem_ids": ids}},
            "statistics": {"bootstrap_resamples": 50, "bootstrap_seed": 0},
            "generation": {"model": "m", "template": "x", "temperature": 0.6, "top_p": 0.95, "max_tokens": 8,
                           "seed": 0}}


# three spellings of sqrt(3)/2 with three different vote keys (\frac{\sqrt3}{2} now shares the first one's key)
SQRT3_OVER_2 = ["\\boxed{\\frac{\\sqrt{3}}{2}}", "\\boxed{\\frac{1}{2}\\sqrt{3}}", "\\boxed{\\sqrt{3}/2}"]


def test_equivalent_spellings_pool_their_votes(equivalence):
    # 3 spellings of sqrt(3)/2 (correct) once each, 0.5 twice (wrong): by string, 0.5 wins (maj 0);
    # by answer, sqrt(3)/2 has 3 votes against 2 (maj 1)
    responses = SQRT3_OVER_2 + ["\\boxed{0.5}", "\\boxed{\\frac12}"]
    correct = [True, True, True, False, False]
    recs = _records(responses, correct)
    keys = [r["extracted"] for r in recs]
    assert len(set(keys)) == 4  # the vote keys alone do not merge them ("0.5" and "\frac12" do merge)
    assert majority_vote(keys, correct) == 0.0  # the old, string-only vote
    s = summarize(recs, _config(["p0"]), equivalence)
    assert s["tasks"]["t"]["maj@n"]["value"] == 1.0


def test_unbraced_spelling_votes_with_the_braced_one(equivalence):
    responses = ["\\boxed{\\frac{\\sqrt3}{2}}", "\\boxed{\\frac{\\sqrt{3}}{2}}", "\\boxed{2}", "\\boxed{3}"]
    s = summarize(_records(responses, [True, True, False, False]), _config(["p0"]), equivalence)
    assert s["tasks"]["t"]["maj@n"]["value"] == 1.0


def test_units_vote_with_the_number(equivalence):
    responses = ["\\boxed{5}", "\\boxed{5 \\text{ cm}}", "\\boxed{5cm}", "\\boxed{6}", "\\boxed{6}", "\\boxed{7}"]
    correct = [True, True, True, False, False, False]
    s = summarize(_records(responses, correct), _config(["p0"]), equivalence)
    assert s["tasks"]["t"]["maj@n"]["value"] == 1.0


def test_ties_split_and_abstentions_abstain(equivalence):
    # sqrt(3)/2 (two spellings, correct) ties with 0.5 (two votes, wrong); two samples state nothing
    responses = SQRT3_OVER_2[:2] + ["\\boxed{0.5}", "so it is \\boxed{\\frac{1}{2}}.", "no idea", "I give up"]
    correct = [True, True, False, False, False, False]
    s = summarize(_records(responses, correct), _config(["p0"]), equivalence)
    assert s["tasks"]["t"]["maj@n"]["value"] == 0.5
    # nobody answered: 0
    s = summarize(_records(["no idea", "none"], [False, False]), _config(["p0"]), equivalence)
    assert s["tasks"]["t"]["maj@n"]["value"] == 0.0


def test_different_answers_stay_apart(equivalence):
    responses = ["\\boxed{\\sqrt{3}}", "\\boxed{\\sqrt{2}}", "\\boxed{\\sqrt{2}}", "\\boxed{x+1}", "\\boxed{x-1}",
                 "\\boxed{x-1}"]
    correct = [True, False, False, False, True, True]
    s = summarize(_records(responses, correct), _config(["p0"]), equivalence)
    assert s["tasks"]["t"]["maj@n"]["value"] == 0.5  # sqrt(2) and x-1 tie at two votes each


def test_order_independent_and_cached(equivalence):
    responses = SQRT3_OVER_2 + ["\\boxed{0.5}", "\\boxed{\\frac12}", "\\boxed{7}", "\\boxed{8}", "\\boxed{8}"]
    correct = [True, True, True, False, False, False, False, False]
    recs = _records(responses, correct)
    cfg = _config(["p0"])
    first = summarize(recs, cfg, equivalence)
    ran = equivalence.comparisons
    shuffled = [dict(r, sample_index=i) for i, r in zip([5, 2, 7, 0, 3, 6, 1, 4], recs)]
    assert summarize(shuffled, cfg, equivalence)["tasks"]["t"]["maj@n"] == first["tasks"]["t"]["maj@n"]
    assert equivalence.comparisons == ran  # every pair came from the cache
    assert first["tasks"]["t"]["maj@n"]["value"] == 1.0


def test_integer_keys_need_no_math_verify():
    eq = AnswerEquivalence(grader=object())  # any use of the grader would fail
    eq.prepare([("12", "13"), ("7", "007"), ("-3", "3")])
    assert (eq.same("12", "13"), eq.same("7", "007"), eq.same("-3", "3")) == (False, True, False)
    assert eq.comparisons == 0


def test_cluster_answers_greedy_by_votes():
    counts = {"a": 1, "b": 3, "c": 2, "d": 1}
    same = {("b", "d"), ("c", "a")}
    groups = cluster_answers(counts, lambda rep, x: (rep, x) in same)
    assert groups == {"b": "b", "c": "c", "a": "c", "d": "b"}
    # the representative is the most-voted answer, and a later answer joins the first group that takes it
    assert majority_vote(["a", "b", "b", "b", "c", "c", "d"], [1, 0, 0, 0, 1, 1, 0],
                         same=lambda rep, x: (rep, x) in same) == 0.0  # b+d = 4 votes beat c+a = 3
    assert majority_vote(["a", "a", "b", "c", "c"], [1, 1, 0, 1, 1], same=lambda r, x: False) == 1.0
