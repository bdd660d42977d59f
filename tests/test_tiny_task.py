"""The built-in tiny arithmetic task: data, tokenizer and a short SFT warm-up, reproducibly."""

import json

import pytest

from rlhf_ext.tours.tiny_task import build_tiny_task, build_tokenizer, make_problems


def test_problems_are_seeded_and_correct():
    a = make_problems(50, seed=3)
    assert a == make_problems(50, seed=3)
    assert a != make_problems(50, seed=4)
    for p in a:
        assert p["label"] == str(p["a"] + p["b"]) and 0 <= p["a"] <= 9 and 0 <= p["b"] <= 9
        assert p["prompt"] == f"What is {p['a']} + {p['b']}?"
    assert max(p["a"] for p in make_problems(200, 0, max_operand=50)) > 9
    with pytest.raises(ValueError, match="n must be >= 1"):
        make_problems(0, 0)


def test_tokenizer_spells_numbers_digit_by_digit_and_has_chat_template():
    tok = build_tokenizer()
    pieces = tok.tokenize("What is 123 + 45? \\boxed{168}")
    assert [p for p in pieces if p.strip("Ġ").isdigit()] == ["1", "2", "3", "4", "5", "1", "6", "8"]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.decode(tok("\\boxed{7}")["input_ids"]) == "\\boxed{7}"


def test_build_is_reproducible_and_sft_learns(tmp_path):
    kwargs = dict(n_train=16, n_eval=8, sft_steps=25, verbose=False)
    info = build_tiny_task(tmp_path / "a", seed=1, **kwargs)
    again = build_tiny_task(tmp_path / "b", seed=1, **kwargs)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    assert info["sft_final_loss"] == again["sft_final_loss"]
    # 25 steps from random init: the loss must have fallen far below uniform guessing (ln 311 ~ 5.7)
    assert info["sft_final_loss"] < 1.0
    rows = [json.loads(l) for l in (tmp_path / "a" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and set(rows[0]) == {"prompt", "label"}
    ev = [json.loads(l) for l in (tmp_path / "a" / "eval.jsonl").read_text().splitlines()]
    assert len(ev) == 8 and set(ev[0]) == {"id", "problem", "answer"}
    assert (tmp_path / "a" / "model" / "config.json").exists()
    assert (tmp_path / "a" / "model" / "tokenizer.json").exists()
    assert 0.0 <= info["sample_accuracy_t1"] <= 1.0
