"""The grader on a labelled corpus of real model outputs (tests/data/graded_responses.jsonl.gz).

1,400 real responses (800 from Qwen2.5-Math-7B-Instruct on MATH, 600 from GPT-3 on GSM8K; origin,
licences and labels in tests/data/SOURCES.md), graded by rlhf_ext and by real math-verify. The floors
are the measured numbers (docs/benchmarks.md, "Grading recall on real outputs") less a small margin;
``benchmarks/grading_recall.py`` prints the full table, with Qwen2.5-Math's ``math_equal`` beside.
"""

import importlib.util
import os

import pytest

from rlhf_ext.rewards import MathGrader

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "grading_recall.py")
_spec = importlib.util.spec_from_file_location("grading_recall", _BENCH)
grading_recall = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grading_recall)


@pytest.fixture(scope="module")
def corpus():
    return grading_recall.load_corpus()


@pytest.fixture(scope="module")
def verdicts(corpus):
    responses, golds = [r["response"] for r in corpus], [r["gold"] for r in corpus]
    with MathGrader(require_anchor=False) as evaluation, MathGrader(require_anchor=True) as reward:
        ev = [x.correct for x in evaluation.grade_batch(responses, golds)]
        rw = [x.correct for x in reward.grade_batch(responses, golds)]
    return {"eval": ev, "reward": rw, "math-verify": grading_recall.grade_math_verify(corpus)}


def _part(corpus, verdicts, dataset=None):
    idx = [i for i, r in enumerate(corpus) if dataset in (None, r["dataset"])]
    return grading_recall.scores([verdicts[i] for i in idx], [corpus[i]["label"] for i in idx])


def test_corpus_is_what_sources_md_describes(corpus):
    assert len(corpus) == 1400
    assert sum(r["dataset"] == "math" for r in corpus) == 800
    assert sum(r["dataset"] == "gsm8k" for r in corpus) == 600
    assert len({r["id"] for r in corpus}) == len(corpus)
    # Both classes present in both parts, so precision and recall both mean something.
    for d in ("math", "gsm8k"):
        labels = [r["label"] for r in corpus if r["dataset"] == d]
        assert 0 < sum(labels) < len(labels)
    # Every hand correction is recorded, and only those labels differ from the source's.
    changed = {r["id"] for r in corpus if r["label"] != r["source_label"]}
    assert changed == set(grading_recall.LABEL_FIXES)
    assert all(r["label"] == grading_recall.LABEL_FIXES[r["id"]][0] for r in corpus if r["id"] in changed)


def test_evaluation_grader_precision_and_recall_floors(corpus, verdicts):
    for dataset in ("math", "gsm8k", None):
        s = _part(corpus, verdicts["eval"], dataset)
        assert s["precision"] >= 0.995, (dataset, s)
        assert s["recall"] >= 0.995, (dataset, s)


def test_reward_grader_floors(corpus, verdicts):
    # Boxed MATH answers are anchored: the reward finds them all.
    s = _part(corpus, verdicts["reward"], "math")
    assert s["precision"] >= 0.995 and s["recall"] >= 0.995, s
    # GSM8K's "A: 18" is no anchor, so the reward (which rewards the format too) scores it 0, never 1
    # for a wrong one: precision holds everywhere.
    assert _part(corpus, verdicts["reward"])["precision"] >= 0.995


def test_not_worse_than_math_verify(corpus, verdicts):
    labels = [r["label"] for r in corpus]
    ours = _part(corpus, verdicts["eval"])
    theirs = _part(corpus, verdicts["math-verify"])
    assert ours["fn"] <= theirs["fn"] and ours["fp"] <= theirs["fp"], (ours, theirs)
    # math-verify really ran and really graded: it finds most right answers and rejects the wrong ones.
    assert theirs["recall"] >= 0.95 and theirs["precision"] >= 0.95, theirs
    # Where the two differ, rlhf_ext is the one that matches the label.
    for i, (a, b) in enumerate(zip(verdicts["eval"], verdicts["math-verify"])):
        if a != b:
            assert a == labels[i], corpus[i]["id"]
