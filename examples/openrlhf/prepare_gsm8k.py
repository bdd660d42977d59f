"""Write GSM8K's training split as the prompt JSONL the example recipes read.

    python examples/openrlhf/prepare_gsm8k.py                       # -> data/gsm8k_train.jsonl
    python examples/openrlhf/prepare_gsm8k.py --out my.jsonl --limit 1000

Each line keeps GSM8K's own fields: ``question`` (the prompt, wrapped in the model's chat template
by ``--data.apply_chat_template``) and ``answer`` (the worked solution ending in ``#### N``, the gold
that rlhf_ext's math reward parses). Needs the ``datasets`` package and access to the Hugging Face Hub.
"""

import argparse
import json
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/gsm8k_train.jsonl", help="output JSONL path")
    parser.add_argument("--split", default="train", choices=["train", "test"], help="GSM8K split")
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N problems")
    args = parser.parse_args()

    from datasets import load_dataset

    rows = load_dataset("openai/gsm8k", "main", split=args.split)
    if args.limit is not None:
        rows = rows.select(range(min(args.limit, len(rows))))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({"question": row["question"], "answer": row["answer"]}) + "\n")
    print(f"wrote {len(rows)} problems to {args.out}")


if __name__ == "__main__":
    main()
