"""rlhf_ext.data without a model: pass-rate ranges, filter / pairs / sft rules on hand-made sample
groups, clean's rules (real MathGrader, real datasketch, the benchmark files in ../shared/data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf_ext.data import (DataToolError, PromptGroup, SampledRun, build_pairs, build_sft, filter_prompts,
                           pairs_for_group, parse_acc_range, pass_rate_histogram, write_jsonl)
from rlhf_ext.data.clean import clean_rows
from rlhf_ext.data.rules import cjk_fraction, normalize, web_junk

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _s(i, text, correct, tokens, truncated=False):
    return {"sample_index": i, "response": text, "correct": correct, "response_tokens": tokens,
            "truncated": truncated, "prompt": "<rendered>"}


def _group(pid, samples, problem="What is 1 + 1?", gold="2"):
    return PromptGroup(id=pid, problem=problem, gold=gold, row={"q": problem}, prompt="<rendered>", samples=samples)


def _run(groups, template="chat"):
    return SampledRun(path=Path("x"), config={"generation": {"template": template, "system_prompt": None}},
                      task="t", n_samples=max(g.n for g in groups), groups=groups)


@pytest.mark.parametrize("text, inside, outside", [
    ("0<acc<1", [0.125, 0.5, 0.875], [0.0, 1.0]),
    ("0.2<=acc<=0.8", [0.2, 0.5, 0.8], [0.1, 0.9]),
    ("acc<1", [0.0, 0.9], [1.0]),
    ("acc>0", [0.1, 1.0], [0.0]),
    ("acc>=0.5", [0.5, 1.0], [0.49]),
    ("acc==1", [1.0], [0.99]),
    ("acc<=0", [0.0], [0.01]),
])  # fmt: skip
def test_acc_ranges(text, inside, outside):
    r = parse_acc_range(text)
    assert all(v in r for v in inside) and not any(v in r for v in outside)


@pytest.mark.parametrize("text", ["", "acc", "1<acc<0", "0<acc<2", "__import__('os')", "0.5<acc<0.5", "x<1"])
def test_acc_range_rejects_bad_text(text):
    with pytest.raises(DataToolError):
        parse_acc_range(text)


def test_filter_keeps_the_range_and_counts_drops():
    groups = [
        _group("a", [_s(0, "\\boxed{2}", True, 5), _s(1, "\\boxed{3}", False, 5)]),       # 0.5
        _group("b", [_s(0, "\\boxed{2}", True, 5), _s(1, "\\boxed{2} ", True, 6)]),       # 1.0
        _group("c", [_s(0, "\\boxed{5}", False, 5), _s(1, "x", False, 9, truncated=True)]),  # 0.0
        _group("d", [_s(0, "\\boxed{2}", True, 5), _s(1, "x", False, 9, truncated=True)]),  # 0.5, half truncated
        _group("e", []),
    ]
    rows, counts = filter_prompts(_run(groups), parse_acc_range("0<acc<1"), max_truncated=0.25,
                                  input_key="question", label_key="answer")
    assert rows == [{"question": "What is 1 + 1?", "answer": "2", "id": "a", "pass_rate": 0.5}]
    assert counts == {"kept": 1, "dropped_acc": 2, "dropped_truncated": 1, "not_sampled": 1}
    hist = "\n".join(pass_rate_histogram(groups))
    assert "acc = 0            1" in hist and "acc = 1            1" in hist and "[0.5, 0.6)         2" in hist
    with pytest.raises(ValueError, match="must differ"):
        filter_prompts(_run(groups), parse_acc_range("acc<1"), input_key="k", label_key="k")


def test_pairs_mixed_are_capped_deterministic_and_never_choose_truncated():
    samples = [_s(0, "\\boxed{2}", True, 5), _s(1, "so \\boxed{2}", True, 7), _s(2, "\\boxed{2}", True, 5),
               _s(3, "\\boxed{2", True, 30, truncated=True), _s(4, "\\boxed{3}", False, 5),
               _s(5, "\\boxed{4}", False, 6), _s(6, "\\boxed{9}", False, 8)]
    g = _group("p1", samples)
    rule, pairs = pairs_for_group(g, max_per_prompt=4, seed=0)
    assert rule == "mixed" and len(pairs) == 4  # 2 distinct complete correct x 3 wrong = 6, capped at 4
    assert all(c["correct"] and not c["truncated"] and not r["correct"] for c, r in pairs)
    assert len({(c["response"], r["response"]) for c, r in pairs}) == 4
    again = pairs_for_group(g, max_per_prompt=4, seed=0)[1]
    assert [(c["sample_index"], r["sample_index"]) for c, r in again] == \
        [(c["sample_index"], r["sample_index"]) for c, r in pairs]
    all_six = pairs_for_group(g, max_per_prompt=10, seed=0)[1]
    assert len(all_six) == 6
    other_seeds = {tuple((c["sample_index"], r["sample_index"]) for c, r in pairs_for_group(g, seed=s)[1])
                   for s in range(8)}
    assert len(other_seeds) > 1  # the seed decides which 4 of the 6


def test_pairs_all_correct_is_a_brevity_2x2_and_all_wrong_is_dropped():
    right = [_s(i, f"{'a' * t} \\boxed{{2}}", True, t) for i, t in enumerate([9, 3, 12, 5, 7])]
    rule, pairs = pairs_for_group(_group("p", right))
    assert rule == "brevity"
    assert sorted((c["response_tokens"], r["response_tokens"]) for c, r in pairs) == [(3, 9), (3, 12), (5, 9), (5, 12)]
    assert pairs_for_group(_group("p", right), brevity=False) == ("all_correct", [])
    wrong = [_s(i, f"\\boxed{{{i}}}", False, 5) for i in range(3)]
    assert pairs_for_group(_group("w", wrong)) == ("all_wrong", [])
    cut = [_s(0, "\\boxed{2", True, 30, truncated=True), _s(1, "\\boxed{7}", False, 5)]
    assert pairs_for_group(_group("c", cut)) == ("no_complete_correct", [])


def test_pairs_output_formats():
    g = _group("p", [_s(0, "\\boxed{2}", True, 5), _s(1, "\\boxed{3}", False, 5)])
    rows, pair_counts, prompt_counts = build_pairs(_run([g], template="r1"))
    assert pair_counts == {"mixed": 1} and prompt_counts == {"mixed": 1}
    (row,) = rows
    assert row["prompt"] == [{"role": "user", "content": "What is 1 + 1?\nPlease reason step by step, and put "
                                                          "your final answer within \\boxed{}."}]
    assert row["chosen"] == [{"role": "assistant", "content": "\\boxed{2}"}]
    assert row["rejected"] == [{"role": "assistant", "content": "\\boxed{3}"}]
    (text_row,), _, _ = build_pairs(_run([g]), text=True)
    assert (text_row["prompt"], text_row["chosen"], text_row["rejected"]) == ("<rendered>", "\\boxed{2}", "\\boxed{3}")
    with pytest.raises(DataToolError, match="--text"):
        build_pairs(_run([g], template="none"))


def test_sft_keeps_distinct_complete_correct_answers_shortest_first():
    g = _group("p", [_s(0, "long \\boxed{2}", True, 9), _s(1, "\\boxed{2}", True, 4), _s(2, "\\boxed{2}", True, 4),
                     _s(3, "\\boxed{2", True, 40, truncated=True), _s(4, "\\boxed{1}", False, 4)])
    always = _group("q", [_s(0, "\\boxed{2}", True, 4)])
    rows, counts = build_sft(_run([g, always]), parse_acc_range("0<acc<1"), max_per_prompt=1)
    assert [r["messages"][-1]["content"] for r in rows] == ["\\boxed{2}"]
    assert rows[0]["messages"][0] == {"role": "user", "content": "What is 1 + 1?"}
    assert counts["prompts_kept"] == 1 and counts["prompts_dropped_acc"] == 1 and counts["examples"] == 1
    rows, _ = build_sft(_run([g]), parse_acc_range("acc>0"), text=True)
    assert [(r["prompt"], r["response"]) for r in rows] == [("<rendered>", "\\boxed{2}"), ("<rendered>",
                                                                                           "long \\boxed{2}")]


def test_write_jsonl_refuses_to_overwrite(tmp_path):
    out = tmp_path / "o.jsonl"
    assert write_jsonl(out, [{"a": 1}]) == 1
    with pytest.raises(DataToolError, match="refusing to overwrite"):
        write_jsonl(out, [{"a": 2}])
    assert json.loads(out.read_text()) == {"a": 1}
    write_jsonl(out, [{"a": 2}], force=True)
    assert json.loads(out.read_text()) == {"a": 2}


def test_text_rules():
    assert normalize("  What  IS 3 + 4?\n") == "what is 3 + 4?"
    assert normalize("3 + 4") != normalize("3 - 4")
    assert web_junk("see https://example.com/x for details").startswith("https://example.com")
    assert web_junk("Click here to subscribe") and not web_junk("Find x if 2x + 3 = 7.")
    assert cjk_fraction("求 x 的值") == pytest.approx(3 / 4)
    assert cjk_fraction("Find $\\frac{1}{2}$ of 10.") == 0.0


def test_clean_drops_by_rule_and_decontaminates_against_the_benchmark_files(tmp_path):
    math500 = [json.loads(line) for line in (SHARED_DATA / "math500.jsonl").read_text().splitlines()[:3]]
    leaked = math500[1]["problem"]
    base = ("A farmer has {n} cows and buys {m} more each week for {w} weeks while selling two of them every "
            "month; how many cows does the farmer have at the end of the period?")
    rows = [
        {"problem": base.format(n=3, m=4, w=5), "answer": "23"},                       # kept
        {"problem": "Compute 2 + 2.", "answer": ""},                                   # missing
        {"problem": "Compute 3 + 3.", "answer": "\\frac{1}{"},                         # ungradable
        {"problem": "Visit www.example.com to find x.", "answer": "3"},                # web
        {"problem": "计算三加四等于多少", "answer": "7"},                                # language
        {"problem": "Note: " + leaked, "answer": "1"},                                 # contaminated
        {"problem": "  " + base.format(n=3, m=4, w=5).upper(), "answer": "23"},        # duplicate
        {"problem": base.format(n=3, m=4, w=6), "answer": "27"},                       # near duplicate
        {"problem": "Find the number of positive divisors of 2024.", "answer": "12"},  # kept
    ]
    kept, dropped, hits, counts = clean_rows(rows, benchmark_dirs=[SHARED_DATA])
    assert [r["answer"] for r in kept] == ["23", "12"]
    assert [d["drop_rule"] for d in dropped] == ["missing", "ungradable", "web", "language", "contaminated",
                                                 "duplicate", "near_duplicate"]
    assert counts == {rule: 1 for rule in ("missing", "ungradable", "web", "language", "contaminated", "duplicate",
                                           "near_duplicate")}
    (hit,) = hits
    assert hit["benchmark"] == "math500" and hit["line"] == 6 and hit["benchmark_text"] == leaked
    assert len(hit["ngram"].split()) == 8 and hit["ngram"] in normalize(leaked)
    # --against FILE: any JSONL of problems
    against = tmp_path / "mine.jsonl"
    against.write_text(json.dumps({"question": "Find the number of positive divisors of 2024."}) + "\n")
    kept2, _, hits2, _ = clean_rows(rows[8:], against=[against], check_gradable=False)
    assert kept2 == [] and hits2[0]["benchmark"] == "mine.jsonl"


def test_clean_cli_prints_counts_and_refuses_overwrite(tmp_path, capsys):
    from rlhf_ext.cli import main

    src = tmp_path / "train.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [{"problem": "Compute 5 + 6.", "answer": "11"},
                                                      {"problem": "compute 5 + 6.", "answer": "11"}]) + "\n")
    out = tmp_path / "clean.jsonl"
    assert main(["data", "clean", str(src), "--output", str(out), "--dropped", str(tmp_path / "d.jsonl"),
                 "--no-grade-check"]) == 0
    text = capsys.readouterr().out
    assert "2 rows -> kept 1, dropped 1" in text and "duplicate             1" in text
    assert "decontamination skipped" in text
    assert main(["data", "clean", str(src), "--output", str(out)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err


def test_data_help_has_examples(capsys):
    from rlhf_ext.cli import main

    for cmd in ("sample", "filter", "pairs", "sft", "clean"):
        with pytest.raises(SystemExit) as exc:
            main(["data", cmd, "--help"])
        assert exc.value.code == 0
        assert f"rlhf-ext data {cmd} " in capsys.readouterr().out


def _choice_sample_dir(tmp_path, shuffle=None):
    """A sample directory of a choice task written as evalkit writes one (issue 25)."""
    from rlhf_ext.evalkit.tasks import custom_task, load_task
    from rlhf_ext.tours.tiny_task import make_choice_problems

    source = tmp_path / "choice.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in make_choice_problems(2, seed=4)))
    spec = {"name": "pick", "problem_key": None, "answer_key": None, "id_key": None, "answer_type": "choice"}
    data = load_task("pick", source, task=custom_task(**spec))
    out = tmp_path / "sampled"
    out.mkdir()
    generation = {"template": "chat", "system_prompt": None, "custom_task": {k: v for k, v in spec.items()}}
    if shuffle is not None:
        generation["shuffle_options"] = shuffle
    config = {"suite": "pick", "tasks": ["pick"], "n_samples": 2, "custom_task": spec, "generation": generation,
              "datasets": {"pick": {"source": str(source), "sha256": data.sha256,
                                    "problem_ids": [p.id for p in data.problems]}}}
    (out / "config.json").write_text(json.dumps(config))
    recs = []
    for k, p in enumerate(data.problems):
        gold = json.loads(p.gold)["answer"]
        wrong = next(lab for lab in "ABCD" if lab != gold)
        # problem 0: right twice; 1: right once; 2, 3: wrong twice
        answers = [gold, gold] if k == 0 else [gold, wrong] if k == 1 else [wrong, wrong]
        for i, lab in enumerate(answers):
            recs.append({"task": "pick", "problem_id": p.id, "sample_index": i, "prompt": "<rendered>",
                         "response": f"Thinking {i}. \\boxed{{{lab}}}", "correct": lab == gold, "extracted": lab,
                         "truncated": False, "response_tokens": 5 + i, "answer_type": "choice",
                         "parse_status": "ok"})
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return out, data


def test_filter_pairs_sft_on_a_choice_task(tmp_path):
    from rlhf_ext.data.sample_dirs import load_sample_dir
    from rlhf_ext.rewards import WeightedReward

    out, data = _choice_sample_dir(tmp_path)
    run = load_sample_dir(out)
    assert [g.pass_rate for g in run.groups] == [1.0, 0.5, 0.0, 0.0]
    rows, counts = filter_prompts(run, parse_acc_range("0<acc<1"), input_key="prompt", label_key="label")
    assert counts["kept"] == 1 and rows[0]["prompt"] == data.problems[1].text  # the options are in the prompt
    # the label is the structured gold: a training job's reward grades against it as it stands
    label = rows[0]["label"]
    right = json.loads(label)["answer"]
    with WeightedReward("choice") as reward:
        assert reward([f"\\boxed{{{right}}}", "\\boxed{Z}"], [label, label]).rewards == [1.0, -0.5]
    pairs, _, _ = build_pairs(run)
    assert pairs and all(f"\\boxed{{{json.loads(data.problems[1].gold)['answer']}}}" in p["chosen"][-1]["content"]
                         for p in pairs if p["id"] == data.problems[1].id)
    sft, _ = build_sft(run, parse_acc_range("acc>0"))
    assert {r["id"] for r in sft} == {data.problems[0].id, data.problems[1].id}


def test_data_tools_refuse_shuffled_options(tmp_path):
    from rlhf_ext.data.sample_dirs import load_sample_dir

    out, _ = _choice_sample_dir(tmp_path, shuffle=3)
    with pytest.raises(DataToolError, match="--shuffle-options"):
        load_sample_dir(out)
