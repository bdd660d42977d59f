"""``evalkit run --data FILE --name NAME [options]``: evaluate a model on any JSONL of problems with gold
answers (math, multiple choice or ranking), with the run options of ``evalkit TASK`` (:mod:`.evaluate`)."""

from __future__ import annotations

import argparse

from . import CUSTOM_EPILOG, EPILOG, evaluate

DESCRIPTION = "Evaluate a model on any JSONL of problems with gold answers."
# the custom task's examples, then the run defaults of every evaluation
FULL_EPILOG = CUSTOM_EPILOG + "\n" + EPILOG.split("\n\n", 1)[1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    evaluate.add_arguments(p)
    g = p.add_argument_group("custom task")
    g.add_argument("--name", help="the task's name in records, reports and comparisons (required, except with "
                                  "--resume)")
    g.add_argument("--problem-key", help="field holding the problem text (default: problem, question or Problem)")
    g.add_argument("--answer-key", help="field holding the gold answer (default: answer or Answer)")
    g.add_argument("--id-key", help="field holding a unique problem id (default: id, unique_id, idx or ID; "
                                    "else the line number)")
    g.add_argument("--answer-type", choices=("math", "choice", "ranking"),
                   help="math (default): a math answer graded by math-verify; choice: rows hold 'options' (a list, "
                        "lettered A, B, ..., or an object label: text) and 'answer' (a label); ranking: 'answer' is "
                        "every label in order, best first. Rows may share a 'pair_id' with their flipped twin "
                        "(docs/evalkit.md)")
    g.add_argument("--shuffle-options", type=int, metavar="SEED",
                   help="choice/ranking: show each sample's options in its own order, re-lettered (the answer "
                        "mapped; each record keeps the map), so position bias shows")


def parser() -> argparse.ArgumentParser:
    """``evalkit run``'s parser on its own (as the command line builds it)."""
    p = argparse.ArgumentParser(prog="evalkit run", description=DESCRIPTION, epilog=FULL_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def custom_task(args: argparse.Namespace) -> dict:
    """The custom task's flags, as :func:`.evaluate.run_options` takes them."""
    return {"name": args.name, "problem_key": args.problem_key, "answer_key": args.answer_key,
            "id_key": args.id_key, "answer_type": args.answer_type}


def run(args: argparse.Namespace) -> int:
    return evaluate.evaluate(args.name, args, custom_task(args))
