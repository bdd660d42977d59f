"""The same prompt for training and evaluation: evalkit's r1-zero and file templates, the comparison of a
run's training prompt with an evaluation's, the warning in evalkit and the report, the run record's field."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlhf_ext import runs
from rlhf_ext.evalkit.provenance import template_warning, training_record_of
from rlhf_ext.evalkit.runner import RunOptions, prepare
from rlhf_ext.evalkit.templates import (R1_ZERO_TEMPLATE, TemplateError, evaluation_prompt_form, render_prompt,
                                        template_mismatch, training_prompt_form)
from rlhf_ext.evalkit.tiny_model import build_tiny_tokenizer
from rlhf_ext.patches.openrlhf import run_record as rr

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_r1_zero_is_the_eight_algorithm_suites_training_prompt_byte_for_byte():
    suite = tomllib.loads((ROOT / "examples" / "suites" / "eight_algorithms.toml").read_text())
    assert suite["vars"]["prompt_template"] == R1_ZERO_TEMPLATE
    # and the suite now evaluates with it
    assert suite["vars"]["evaluate"][suite["vars"]["evaluate"].index("--template") + 1] == "r1-zero"
    args = {"data.apply_chat_template": False, "data.input_template": suite["vars"]["prompt_template"]}
    assert template_mismatch(args, {"template": "r1-zero"}) is None
    assert "differs" in template_mismatch(args, {"template": "qwen25-math-cot"})


def test_r1_zero_and_file_templates_render_like_openrlhfs_input_template(tokenizer, tmp_path):
    r = render_prompt("What is 2 + 2?", "r1-zero", tokenizer)
    assert r.text == R1_ZERO_TEMPLATE.replace("{}", "What is 2 + 2?") and r.text.endswith("Assistant: <think>")
    assert list(r.token_ids) == tokenizer(r.text, add_special_tokens=True)["input_ids"]
    own = render_prompt("1+1", "file", tokenizer, template_text="Q: {}\nA:")
    assert own.text == "Q: 1+1\nA:"
    with pytest.raises(TemplateError, match="exactly one '\\{\\}'"):
        render_prompt("1+1", "file", tokenizer, template_text="no placeholder")
    with pytest.raises(TemplateError, match="needs a chat template"):
        render_prompt("1+1", "r1-zero", tokenizer, system_prompt="be brief")
    # a file template is part of the generation parameters (another text = another run)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    spec = {"name": "t", "problem_key": None, "answer_key": None, "id_key": None}
    run = prepare(RunOptions(suite="t", model="m", data=[str(data)], custom_task=spec, template="file",
                             template_text="Q: {}\nA:", output=tmp_path / "o"))
    assert run.generation["template"] == "file" and run.generation["template_text"] == "Q: {}\nA:"
    with pytest.raises(ValueError, match="--template-file"):
        RunOptions(suite="gsm8k", model="m", template="file").validate()


def test_prompt_forms_and_mismatch_sentences():
    chat = {"data.apply_chat_template": True, "data.input_template": "ignored {}"}  # OpenRLHF ignores it then
    assert training_prompt_form(chat) == ("chat", "{}", None)
    assert training_prompt_form({"data.input_template": None, "data.apply_chat_template": False}) == ("text", "{}", None)
    assert training_prompt_form({}) is None  # an imported run: unknown, no warning
    assert template_mismatch(chat, {"template": "chat"}) is None
    message = template_mismatch(chat, {"template": "r1"})
    assert "r1" in message and "Please reason step by step" in message and "tens of points" in message
    assert template_mismatch(chat, {"template": "chat", "system_prompt": "be brief"})  # a system prompt differs
    assert evaluation_prompt_form({"template": "file", "template_text": "Q: {}"}) == ("text", "Q: {}", None)
    plain = {"data.apply_chat_template": False, "data.input_template": "Q: {}"}
    assert template_mismatch(plain, {"template": "file", "template_text": "Q: {}"}) is None
    assert template_mismatch(plain, {"template": "none"})


def record(tmp_path, **flags) -> Path:
    """A run record's config.json written by the plugin's driver code (build_config)."""
    ns = SimpleNamespace()
    values = {"ckpt.path": str(tmp_path / "ckpt"), "ckpt.output_dir": str(tmp_path / "model"),
              "data.input_key": "prompt", **flags}
    for key, value in values.items():
        setattr(ns, key, value)
    run_dir = tmp_path / "ckpt" / "rlhf_ext_run"
    run_dir.mkdir(parents=True)
    runs.write_json_atomic(run_dir / runs.CONFIG, rr.build_config(ns, str(run_dir), started_at=0.0))
    (tmp_path / "model").mkdir()
    (tmp_path / "ckpt" / "global_step10_hf").mkdir()
    return run_dir


def test_the_run_record_stores_its_prompt_and_evalkit_finds_the_run_of_a_checkpoint(tmp_path):
    run_dir = record(tmp_path, **{"data.apply_chat_template": True, "data.input_template": None})
    config = json.loads((run_dir / runs.CONFIG).read_text())
    assert config["prompt_template"] == {"apply_chat_template": True, "input_template": None, "input_key": "prompt"}
    for model in (tmp_path / "model", tmp_path / "ckpt" / "global_step10_hf"):
        found = training_record_of(model)
        assert found is not None and found[0] == run_dir
        assert template_warning(model, {"template": "chat"}) is None
        warning = template_warning(model, {"template": "r1"})
        assert "differs from the one the run trained with" in warning and str(run_dir) in warning
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert training_record_of(other) is None


def test_the_report_warns_about_an_evaluation_in_another_template(tmp_path):
    from rlhf_ext.report import collect
    from rlhf_ext.report.synthetic import write_synthetic_eval, write_synthetic_run

    run = write_synthetic_run(tmp_path / "r", steps=20, extra_args={"data.apply_chat_template": True})
    evals = tmp_path / "evals"
    write_synthetic_eval(evals / "final_chat", model=run / "final", accuracy=0.5)
    other = write_synthetic_eval(evals / "final_r1", model=run / "final", accuracy=0.5, seed=1)
    cfg = json.loads((other / "config.json").read_text())
    cfg["generation"]["template"] = "r1"
    (other / "config.json").write_text(json.dumps(cfg))
    data = collect([run], [evals])
    assert len(data.template_notes) == 1 and "final_r1" in data.template_notes[0]
    assert any(h.startswith("Warning: 1 evaluation(s) used a prompt template") for h in data.headline)
