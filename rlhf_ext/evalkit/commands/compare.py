"""``evalkit compare RUN_A RUN_B [...]``: paired differences against the first run, with verdicts at the
experiment's resolution (:mod:`rlhf_ext.evalkit.resolution`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ...ground.subcommands import usage_error


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="baseline first, then the runs to compare")
    p.add_argument("--bootstrap-resamples", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    p.add_argument("--min-effect", type=float, default=None, metavar="POINTS",
                   help="smallest difference of avg@n / maj@n, in points, that counts as better / worse (default: "
                        "the seed spread of --seed-runs plus the grader error rate of any audit.json in the runs; "
                        "0 when neither was measured)")
    p.add_argument("--seed-runs", nargs="+", type=Path, default=None, metavar="RUN_DIR",
                   help="evaluations of one recipe's seeds (two or more): their SD of avg@n is the seed spread")


def run(args: argparse.Namespace) -> int:
    from ..summary import compare_runs, render_compare_markdown

    if len(args.runs) < 2:
        usage_error(args, "compare needs at least two run directories")
    from ..resolution import apply, audited_error, min_effect, render_verdicts, seed_spread

    spread = seed_spread(args.seed_runs) if args.seed_runs and args.min_effect is None else None
    grader = audited_error([*args.runs, *(args.seed_runs or [])]) if args.min_effect is None else None
    result = compare_runs(args.runs, resamples=args.bootstrap_resamples, seed=args.seed)
    apply(result, min_effect(args.min_effect, spread, grader))
    print(json.dumps(result, indent=2) if args.json else render_compare_markdown(result) + render_verdicts(result))
    return 0
