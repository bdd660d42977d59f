"""Write GSM8K as the parquet files verl's RL dataset reads (train.parquet, test.parquet).

    python examples/verl/prepare_gsm8k.py                          # -> data/gsm8k_verl/{train,test}.parquet
    python examples/verl/prepare_gsm8k.py --input my.jsonl --out data/mine --split train   # offline

Each row has verl's fields: ``data_source`` ("openai/gsm8k"), ``prompt`` (one user message: the
question and an instruction to box the final answer, which verl wraps in the model's chat template),
``ability``, ``reward_model`` (``{"style": "rule", "ground_truth": "<the number after ####>"}``, the
gold rlhf_ext's compute_score grades against) and ``extra_info`` (split, index, the worked answer).
Hub mode needs the ``datasets`` package and access to the Hugging Face Hub; ``--input`` reads a local
JSONL with GSM8K's ``question``/``answer`` fields instead.
"""

import argparse
import json
import os

INSTRUCTION = "Let's think step by step and put the final answer in \\boxed{}."


def gold_number(answer: str) -> str:
    """GSM8K's final answer: the text after the last ``####``, thousands separators removed."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer without '####': {answer[-80:]!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def to_rows(problems, split: str):
    return [{
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{p['question']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gold_number(p["answer"])},
        "extra_info": {"split": split, "index": i, "answer": p["answer"]},
    } for i, p in enumerate(problems)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: python examples/verl/prepare_gsm8k.py --limit 1000")
    parser.add_argument("--out", default="data/gsm8k_verl", help="output directory (default data/gsm8k_verl)")
    parser.add_argument("--input", help="local JSONL with question/answer fields instead of the Hub")
    parser.add_argument("--split", choices=["train", "test"], help="only this split (default both; one with --input)")
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N problems of each split")
    args = parser.parse_args(argv)

    import pandas as pd

    splits = [args.split] if args.split else (["train"] if args.input else ["train", "test"])
    os.makedirs(args.out, exist_ok=True)
    for split in splits:
        if args.input:
            with open(args.input, encoding="utf-8") as f:
                problems = [json.loads(line) for line in f if line.strip()]
        else:
            from datasets import load_dataset

            problems = list(load_dataset("openai/gsm8k", "main", split=split))
        problems = problems[: args.limit] if args.limit is not None else problems
        path = os.path.join(args.out, f"{split}.parquet")
        pd.DataFrame(to_rows(problems, split)).to_parquet(path)
        print(f"wrote {len(problems)} problems to {path}")


if __name__ == "__main__":
    main()
