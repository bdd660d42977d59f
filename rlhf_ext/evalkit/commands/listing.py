"""``evalkit list``: the tasks, their sources, sizes and answer formats."""

from __future__ import annotations

import argparse
import json

from ..tasks import SUITES, TASKS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    rows = [{"task": t.name, "title": t.title, "hub": t.hub_id + (f" ({t.hub_config})" if t.hub_config else "")
             + f" [{t.hub_split}]", "problems": t.size, "answer": t.answer_format,
             "local_file": t.local_names[0]} for t in TASKS.values()]
    if args.json:
        print(json.dumps({"tasks": rows, "suites": {k: list(v) for k, v in SUITES.items()}}, indent=2))
        return 0
    print("| task | benchmark | Hugging Face Hub source [split] | problems | answer format | --data DIR file |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {r['title']} | {r['hub']} | {r['problems']} | {r['answer']} | {r['local_file']} |")
    print("| aime | aime24 + aime25, reported separately and combined | | 60 | | |")
    return 0
