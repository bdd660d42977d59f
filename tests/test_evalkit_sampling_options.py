"""evalkit and ``rlhf-ext data sample``: --top-k and --min-p reach vLLM and are recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlhf_ext.evalkit.commands.evaluate import parser as _run_parser, run_options as _options
from rlhf_ext.evalkit.records import write_json_atomic
from rlhf_ext.evalkit.runner import RunOptions, prepare


def _data(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(3)) + "\n")
    return f


def test_recorded_when_set_and_absent_when_off(tmp_path):
    f = _data(tmp_path)
    spec = {"name": "t", "problem_key": None, "answer_key": None, "id_key": None}
    plain = prepare(RunOptions(suite="t", model="m", data=[str(f)], custom_task=spec, output=tmp_path / "a"))
    # off: not in the generation parameters, so runs made before the options keep their parameters and hash
    assert "top_k" not in plain.generation and "min_p" not in plain.generation
    set_ = prepare(RunOptions(suite="t", model="m", data=[str(f)], custom_task=spec, output=tmp_path / "b",
                              top_k=50, min_p=0.01))
    assert set_.generation["top_k"] == 50 and set_.generation["min_p"] == 0.01


@pytest.mark.parametrize("kwargs, message", [
    ({"top_k": 0}, "--top-k must be -1 \\(off\\) or >= 1"),
    ({"top_k": -2}, "--top-k must be -1"),
    ({"min_p": 1.5}, "--min-p must be in \\[0, 1\\]"),
    ({"min_p": -0.1}, "--min-p must be in \\[0, 1\\]"),
])  # fmt: skip
def test_bad_values_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        RunOptions(suite="gsm8k", model="m", **kwargs).validate()


def test_cli_flags_and_resume_take_them_from_the_run(tmp_path):
    args = _run_parser("gsm8k", "").parse_args(["--model", "m", "--top-k", "50", "--min-p", "0.01"])
    options = _options("gsm8k", args)
    assert (options.top_k, options.min_p) == (50, 0.01)
    defaults = _options("gsm8k", _run_parser("gsm8k", "").parse_args(["--model", "m"]))
    assert (defaults.top_k, defaults.min_p) == (-1, 0.0)
    run = tmp_path / "run"
    run.mkdir()
    write_json_atomic(run / "config.json", {"suite": "gsm8k", "n_samples": 4, "limit": None,
                                            "generation": {"model": "m", "temperature": 1.0, "top_p": 1.0, "top_k": 50,
                                                           "min_p": 0.01, "max_tokens": 8, "template": "r1",
                                                           "system_prompt": None, "seed": 0},
                                            "engine": {"tp": 1, "dp": 1}})
    resumed = _options("gsm8k", _run_parser("gsm8k", "").parse_args(["--resume", "--output", str(run)]))
    assert (resumed.top_k, resumed.min_p) == (50, 0.01)


def test_data_sample_with_top_k_1_samples_the_argmax_and_records_it(tmp_path):
    """A real vLLM run on CPU (random tiny Qwen2, temperature 1): with --top-k 1 every sample of a prompt
    is the argmax continuation, identical across the per-sample seeds; without top-k, near-uniform
    probabilities over the vocabulary make three identical 6-token samples practically impossible."""
    from rlhf_ext.evalkit.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"problem": f"What is {i} + 2?", "answer": str(i + 2)}) for i in range(2)) + "\n")
    out = tmp_path / "sample"
    cmd = [sys.executable, "-m", "rlhf_ext.cli", "data", "sample", "--model", str(model), "--data", str(data),
           "--output", str(out), "--n-samples", "3", "--max-tokens", "6", "--temperature", "1.0",
           "--top-k", "1", "--min-p", "0.05", "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    generation = json.loads((out / "config.json").read_text())["generation"]
    assert generation["top_k"] == 1 and generation["min_p"] == 0.05
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sampling"]["top_k"] == 1 and summary["sampling"]["min_p"] == 0.05
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    by_prompt = {}
    for s in samples:
        by_prompt.setdefault(s["problem_id"], set()).add(s["response"])
    assert len(samples) == 6 and all(len(responses) == 1 for responses in by_prompt.values()), by_prompt
