"""evalkit tasks (data loading, gold normalisation, --data forms, hub errors), templates and seeds."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_ext.evalkit.runner import problem_seed
from rlhf_ext.evalkit.tasks import (SUITES, TASKS, DataError, dataset_sha256, load_task, resolve_data_paths,
                                    rows_to_problems, suite_tasks)
from rlhf_ext.evalkit.templates import BOXED_INSTRUCTION, TemplateError, render_prompt
from rlhf_ext.evalkit.tiny_model import build_tiny_tokenizer

DATA = Path("../shared/data")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.mark.parametrize("task,first_gold,last_gold", [
    ("aime24", "204", "902"), ("aime25", "70", "240"), ("math500", "\\left( 3, \\frac{\\pi}{2} \\right)", "106^\\circ"),
    ("gsm8k", "18", "14"), ("amc23", "27", "8"),
])
def test_shared_data_files_load_with_documented_sizes(task, first_gold, last_gold):
    paths = resolve_data_paths([task], [str(DATA)])
    data = load_task(task, paths[task])
    assert len(data.problems) == TASKS[task].size
    assert data.problems[0].gold == first_gold and data.problems[-1].gold == last_gold
    assert len({p.id for p in data.problems}) == len(data.problems)
    assert data.source == str((DATA / TASKS[task].local_names[0]).resolve())


def test_gold_normalisation_rules():
    gsm = rows_to_problems(TASKS["gsm8k"], [{"question": "q", "answer": "work\n#### 1,234"}], "x")
    assert gsm[0].gold == "1234"
    amc = rows_to_problems(TASKS["amc23"], [{"question": "q", "answer": 27.0}, {"question": "q", "answer": "3.50"},
                                            {"question": "q", "answer": 0.5}], "x")
    assert [p.gold for p in amc] == ["27", "3.50", "0.5"]
    aime = rows_to_problems(TASKS["aime25"], [{"problem": "p", "answer": 70}], "x")
    assert aime[0].gold == "70" and aime[0].id == "0"  # no id field: the row index


def test_limit_keeps_dataset_identity(tmp_path):
    full = load_task("amc23", DATA / "amc23.jsonl")
    first3 = load_task("amc23", DATA / "amc23.jsonl", limit=3)
    assert [p.id for p in first3.problems] == [p.id for p in full.problems[:3]]
    assert first3.sha256 == full.sha256
    rows = [json.loads(line) for line in open(DATA / "amc23.jsonl")]
    rows[5]["answer"] = 999.0
    changed = tmp_path / "amc23.jsonl"
    changed.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_task("amc23", changed).sha256 != full.sha256
    with pytest.raises(DataError, match="--limit must be >= 1"):
        load_task("amc23", DATA / "amc23.jsonl", limit=0)


def test_data_argument_forms(tmp_path):
    aime = ["aime24", "aime25"]
    from_dir = resolve_data_paths(aime, [str(DATA)])
    assert from_dir["aime24"].name == "aime24.jsonl" and from_dir["aime25"].name == "aime25.jsonl"
    named = resolve_data_paths(aime, [f"aime24={DATA}/aime24.jsonl", f"aime25={DATA}/aime25.jsonl"])
    assert named == from_dir
    assert resolve_data_paths(["math500"], [str(DATA / "math500.jsonl")])["math500"].name == "math500.jsonl"
    with pytest.raises(DataError, match="several tasks"):
        resolve_data_paths(aime, [str(DATA / "aime24.jsonl")])
    with pytest.raises(DataError, match="no such file"):
        resolve_data_paths(["math500"], [str(tmp_path / "nope.jsonl")])
    with pytest.raises(DataError, match="gives no file for aime25"):
        resolve_data_paths(aime, [f"aime24={DATA}/aime24.jsonl"])
    with pytest.raises(DataError, match="not part of this run"):
        resolve_data_paths(["math500"], [f"gsm8k={DATA}/gsm8k_test.jsonl"])
    with pytest.raises(DataError, match="looked for math500.jsonl"):
        resolve_data_paths(["math500"], [str(tmp_path)])


def test_malformed_data_is_rejected_with_the_row(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"problem": "p1", "answer": "1"}\n{"problem": "p2"}\n')
    with pytest.raises(DataError, match=r"row 2: no answer"):
        load_task("math500", f)
    f.write_text('{"problem": "p1", "answer": "1"}\n{oops\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        load_task("math500", f)
    f.write_text('{"id": 1, "problem": "p1", "answer": "1"}\n{"id": 1, "problem": "p2", "answer": "2"}\n')
    with pytest.raises(DataError, match="duplicate problem id '1'"):
        load_task("math500", f)
    f.write_text('{"answer": "1"}\n')
    with pytest.raises(DataError, match="no problem text"):
        load_task("math500", f)
    f.write_text("")
    with pytest.raises(DataError, match="no rows"):
        load_task("math500", f)


def test_suites():
    assert suite_tasks("aime") == ("aime24", "aime25")
    assert set(SUITES) == {"aime", "aime24", "aime25", "math500", "gsm8k", "amc23"}
    with pytest.raises(DataError, match="unknown task 'mmlu'"):
        suite_tasks("mmlu")


def test_unreachable_hub_gives_a_clear_error_quickly():
    # A closed local port: the hub probe fails at once, datasets then looks only in an empty cache.
    code = ("from rlhf_ext.evalkit.tasks import load_task, DataError\n"
            "try:\n    load_task('math500')\nexcept DataError as e:\n    print('ERR', e)\n")
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": "/nonexistent-evalkit-hf-home"}
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("ERR math500: could not load HuggingFaceH4/MATH-500"), out.stdout + out.stderr
    assert "--data" in out.stdout and "math500.jsonl" in out.stdout


def test_r1_template_uses_chat_template_and_no_double_special_tokens(tokenizer):
    r = render_prompt("What is 1+1?", "r1", tokenizer)
    assert r.text == f"<|im_start|>user\nWhat is 1+1?\n{BOXED_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    assert list(r.token_ids) == tokenizer(r.text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(list(r.token_ids)) == r.text
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert r.token_ids[0] == start and r.token_ids.count(start) == 2


def test_other_templates(tokenizer):
    q = render_prompt("P?", "qwen25-math-cot", tokenizer)
    assert q.text == (f"<|im_start|>system\n{BOXED_INSTRUCTION}<|im_end|>\n<|im_start|>user\nP?<|im_end|>\n"
                      "<|im_start|>assistant\n")
    q2 = render_prompt("P?", "qwen25-math-cot", tokenizer, system_prompt="Be brief.")
    assert q2.text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    c = render_prompt("P?", "chat", tokenizer, system_prompt="S")
    assert c.text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nP?<|im_end|>\n<|im_start|>assistant\n"
    n = render_prompt("P?", "none", tokenizer)
    assert n.text == "P?" and tokenizer.decode(list(n.token_ids)) == "P?"


def test_template_errors(tokenizer):
    with pytest.raises(TemplateError, match="--system-prompt needs a chat template"):
        render_prompt("P", "none", tokenizer, system_prompt="S")
    with pytest.raises(TemplateError, match="unknown template"):
        render_prompt("P", "alpaca", tokenizer)
    plain = build_tiny_tokenizer()
    plain.chat_template = None
    with pytest.raises(TemplateError, match="has none; use --template qwen25-math-cot"):
        render_prompt("P", "r1", plain)


def test_problem_seed_depends_on_identity_only():
    s = problem_seed(0, "math500", "test/algebra/1.json")
    assert s == problem_seed(0, "math500", "test/algebra/1.json")
    assert 0 <= s < 2 ** 30
    others = {problem_seed(1, "math500", "test/algebra/1.json"), problem_seed(0, "gsm8k", "test/algebra/1.json"),
              problem_seed(0, "math500", "test/algebra/2.json")}
    assert s not in others and len(others) == 3


def test_dataset_sha_is_order_and_content_sensitive():
    rows = [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2"}]
    p = rows_to_problems(TASKS["math500"], rows, "x")
    assert dataset_sha256(p) == dataset_sha256(rows_to_problems(TASKS["math500"], rows, "y"))
    assert dataset_sha256(p) != dataset_sha256(p[::-1])
