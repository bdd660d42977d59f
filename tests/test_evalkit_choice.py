"""evalkit on choice and ranking tasks without a model: loading, option shuffling, and every metric on
hand-made records with hand-computed values (issue 25). The model run is in test_evalkit_e2e.py."""

import json

import pytest

from rlhf_ext.evalkit import choice_metrics
from rlhf_ext.evalkit.commands.custom import parser as _custom_parser
from rlhf_ext.evalkit.commands.evaluate import run_options as _options
from rlhf_ext.evalkit.summary import compare_runs, render_compare_markdown, render_markdown, summarize
from rlhf_ext.evalkit.runner import RunOptions, option_permutation, prompt_key, sample_view
from rlhf_ext.evalkit.tasks import DataError, custom_task, load_task
from rlhf_ext.rewards.choice import grade_structured, parse_structured_gold
from rlhf_ext.tours.tiny_task import make_choice_problems, make_ranking_problems

from test_evalkit_report import make_config, write_run


def rec(pid, idx, *, correct, extracted, status="ok", top1=None, tau=None, pair=None, truncated=False):
    return {"task": "rk", "problem_id": pid, "sample_index": idx, "correct": correct, "extracted": extracted,
            "response_tokens": 10, "truncated": truncated, "gold_parsed": True, "grade_timeout": False,
            "grade_error": None, "answer_type": "ranking", "parse_status": status,
            "top1_correct": correct if top1 is None else top1, "rank_tau": tau, "pair_id": pair}


def ranking_records(fix_q3=False):
    """Pairs x = (q1, q2) and y = (q3, q4); n = 2. Golds: q1, q3 C>A>B; q2, q4 B>A>C."""
    r = [rec("q1", 0, correct=True, extracted="C>A>B", tau=1.0, pair="x"),
         rec("q1", 1, correct=False, top1=True, extracted="C>B>A", tau=1 / 3, pair="x"),
         rec("q2", 0, correct=True, extracted="B>A>C", tau=1.0, pair="x"),
         rec("q2", 1, correct=True, extracted="B>A>C", tau=1.0, pair="x"),
         rec("q4", 0, correct=False, extracted="A>B>C", tau=1 / 3, pair="y"),
         rec("q4", 1, correct=True, extracted="B>A>C", tau=1.0, pair="y")]
    if fix_q3:
        r += [rec("q3", i, correct=True, extracted="C>A>B", tau=1.0, pair="y") for i in range(2)]
    else:
        r += [rec("q3", 0, correct=False, extracted=None, status="unparseable", pair="y"),
              rec("q3", 1, correct=False, extracted=None, status="invalid", pair="y", truncated=True)]
    return r


def test_ranking_summary_hand_computed():
    cfg = make_config(["rk"], 2, {"rk": ["q1", "q2", "q3", "q4"]})
    t = summarize(ranking_records(), cfg)["tasks"]["rk"]
    assert t["answer_type"] == "ranking"
    assert t["avg@n"]["value"] == pytest.approx((0.5 + 1 + 0 + 0.5) / 4)  # full-ranking accuracy
    assert t["top1@n"]["value"] == pytest.approx((1 + 1 + 0 + 0.5) / 4)  # the pick
    # per problem mean tau, an unreadable ranking counting 0: q1 (1 + 1/3)/2, q2 1, q3 0, q4 (1/3 + 1)/2
    assert t["rank_correlation"]["value"] == pytest.approx((2 / 3 + 1 + 0 + 2 / 3) / 4)
    assert t["parse_failure_rate"]["value"] == pytest.approx(0.25)
    assert t["truncation"]["value"] == pytest.approx(0.125)
    # maj@n over orders: q1 tie (one right) 0.5, q2 1, q3 no votes 0, q4 tie 0.5
    assert t["maj@n"]["value"] == pytest.approx(0.5)
    assert t["parse_outcomes"] == {"invalid": 1, "ok": 6, "unparseable": 1}
    pc = t["pair_consistency"]
    assert (pc["pairs"], pc["unpaired_problems"]) == (2, 0)
    # pair x: sample 0 both right, sample 1 q1 wrong -> 0.5; pair y: 0
    assert pc["both@n"]["value"] == pytest.approx(0.25)
    assert pc["both_all@n"]["value"] == 0.0 and pc["both_all@n"]["ci95"] == [0.0, 0.0]
    assert pc["both_maj@n"]["value"] == pytest.approx((0.5 * 1 + 0 * 0.5) / 2)
    assert pc["both_top1@n"]["value"] == pytest.approx((1 + 0) / 2)
    for m in ("avg@n", "top1@n", "rank_correlation", "parse_failure_rate", "truncation"):
        lo, hi = t[m]["ci95"]
        assert lo <= t[m]["value"] <= hi
    md = render_markdown(summarize(ranking_records(), cfg))
    assert "rank correlation" in md and "| rk | ranking |" in md and "unparseable 1" in md


def test_pair_members_and_unpaired():
    samples = [[{"pair_id": "a"}], [{"pair_id": "a"}], [{"pair_id": "b"}], [{}], [{"pair_id": "c"}],
               [{"pair_id": "c"}], [{"pair_id": "c"}]]
    pairs, unpaired = choice_metrics.pair_members(list("0123456"), samples)
    assert pairs == [("a", 0, 1)] and unpaired == 1 + 3


def test_choice_votes_are_over_labels_without_a_grader():
    cfg = make_config(["rk"], 3, {"rk": ["q1"]})
    recs = [rec("q1", i, correct=lab == "B", extracted=lab) for i, lab in enumerate(["B", "C", "B"])]
    for r in recs:
        r["answer_type"] = "choice"

    class NoGrader:
        def prepare(self, pairs):
            raise AssertionError("choice answers must not be compared by math-verify")

    t = summarize(recs, cfg, NoGrader())["tasks"]["rk"]
    assert t["maj@n"]["value"] == 1.0 and t["avg@n"]["value"] == pytest.approx(2 / 3)
    assert "top1@n" not in t and "rank_correlation" not in t  # choice: the pick is the accuracy


def test_compare_pairs_structured_metrics(tmp_path):
    cfg = make_config(["rk"], 2, {"rk": ["q1", "q2", "q3", "q4"]})
    a = write_run(tmp_path / "a", cfg, ranking_records())
    b = write_run(tmp_path / "b", cfg, ranking_records(fix_q3=True))
    entry = compare_runs([a, b], resamples=500)["comparisons"][0]["tasks"]["rk"]
    assert entry["avg@n"]["difference"] == pytest.approx(0.25)
    assert entry["rank_correlation"]["difference"] == pytest.approx(0.25)
    assert entry["parse_failure_rate"]["difference"] == pytest.approx(-0.25)
    assert entry["top1@n"]["difference"] == pytest.approx(0.25)
    # pair y: q3 now always right, q4 right in sample 1 only -> both@n 0.5 (was 0); mean over 2 pairs
    assert entry["pairs"] == 2 and entry["both@n"]["difference"] == pytest.approx(0.25)
    md = render_compare_markdown(compare_runs([a, b], resamples=500))
    assert "| rank_correlation |" in md and "| both@n |" in md


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_choice_and_ranking_tasks(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", make_choice_problems(2, seed=1))
    td = load_task("c", f, task=custom_task("c", answer_type="choice"))
    p = td.problems[0]
    gold = parse_structured_gold(p.gold)
    assert p.answer_type == "choice" and p.pair_id == "c0" and gold.answer_type == "choice"
    assert p.text.startswith(p.question + "\n\nA. ") and p.text.count("\n") == 5
    f = write_jsonl(tmp_path / "r.jsonl", make_ranking_problems(2, seed=1))
    td = load_task("r", f, task=custom_task("r", answer_type="ranking"))
    a, b = (parse_structured_gold(p.gold) for p in td.problems[:2])
    assert a.answer == b.answer[::-1]  # the flipped twin
    for rows, message in [([{"problem": "q", "answer": "A"}], "needs an 'options' field"),
                          ([{"problem": "q", "options": ["x", "y"], "answer": "C"}], "not one of the option labels"),
                          ([{"problem": "q", "options": ["x", "y", "z"], "answer": ["A", "B"]}], "must name each")]:
        kind = "ranking" if isinstance(rows[0]["answer"], list) else "choice"
        with pytest.raises(DataError, match=message):
            load_task("x", write_jsonl(tmp_path / "bad.jsonl", rows), task=custom_task("x", answer_type=kind))


def test_shuffled_options_per_sample(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", make_choice_problems(1, seed=3))
    p = load_task("c", f, task=custom_task("c", answer_type="choice")).problems[0]
    gold = parse_structured_gold(p.gold)
    options = RunOptions(suite="c", model="m", custom_task={"name": "c", "answer_type": "choice"}, shuffle_options=7,
                         data=[str(f)])
    perms = {tuple(option_permutation(7, "c", p.id, i, 4)) for i in range(16)}
    assert len(perms) > 1 and all(sorted(q) == [0, 1, 2, 3] for q in perms)
    assert option_permutation(7, "c", p.id, 3, 4) == option_permutation(7, "c", p.id, 3, 4)  # reproducible
    for i in range(8):
        text, shown, mapping = sample_view(options, p, i)
        right_text = gold.options.text_of(gold.answer[0])
        # the shown answer is the label now in front of the right option's text, and maps back to the gold
        assert shown.options.text_of(shown.answer[0]) == right_text and mapping[shown.answer[0]] == gold.answer[0]
        assert f"{shown.answer[0]}. {right_text}" in text and prompt_key(options, p, i) == ("c", p.id, i)
        g = grade_structured(f"\\boxed{{{shown.answer[0]}}}", shown)
        assert g.correct
    plain = RunOptions(suite="c", model="m", custom_task={"name": "c", "answer_type": "choice"}, data=[str(f)])
    assert sample_view(plain, p, 5) == (p.text, p.gold, None) and prompt_key(plain, p, 5) == ("c", p.id)


def test_cli_options(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", make_choice_problems(1, seed=3))
    args = _custom_parser().parse_args(["--model", "m", "--data", str(f), "--name", "c", "--answer-type", "ranking",
                                        "--shuffle-options", "5"])
    custom = {"name": args.name, "problem_key": None, "answer_key": None, "id_key": None,
              "answer_type": args.answer_type}
    o = _options("c", args, custom)
    assert (o.answer_type, o.shuffle_options) == ("ranking", 5)
    args = _custom_parser().parse_args(["--model", "m", "--data", str(f), "--name", "c", "--shuffle-options", "5"])
    o = _options("c", args, {"name": "c", "problem_key": None, "answer_key": None, "id_key": None,
                             "answer_type": None})
    with pytest.raises(ValueError, match="--shuffle-options needs --answer-type"):
        o.validate()


def test_a_ranking_task_without_options(tmp_path):
    # issue 41: the options of a ranking are its answer's labels; the question names them itself
    rows = [{"problem": "Rank the configs A, B, C, best first.", "answer": ["C", "A", "B"]}]
    task = custom_task("r", answer_type="ranking")
    p = load_task("r", write_jsonl(tmp_path / "r.jsonl", rows), task=task).problems[0]
    gold = parse_structured_gold(p.gold)
    assert p.text == rows[0]["problem"] and gold.options.labels == ("A", "B", "C") and gold.answer == ("C", "A", "B")
    assert grade_structured("\\boxed{C > A > B}", gold).correct
    assert not grade_structured("\\boxed{A > C > B}", gold).correct
    # re-lettering options the question names would change the question: refused, saying so
    options = RunOptions(suite="r", model="m", custom_task={"name": "r", "answer_type": "ranking"}, shuffle_options=7,
                         data=[str(tmp_path / "r.jsonl")])
    with pytest.raises(ValueError, match="gives no option texts"):
        sample_view(options, p, 0)
    with pytest.raises(DataError, match="needs an 'options' field"):
        load_task("c", write_jsonl(tmp_path / "c.jsonl", [{"problem": "q", "answer": "A"}]),
                  task=custom_task("c", answer_type="choice"))
