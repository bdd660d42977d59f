"""``rlhf-ext runs ACTION``: show or check a run record, import TensorBoard logs (docs/run_records.md).

The flags of the ``runs`` tool, declared here as every tool declares its own; the record format is
:mod:`rlhf_ext.runs`, the smoke verdict :mod:`rlhf_ext.runs.check`.
"""

from __future__ import annotations

import argparse
import sys

from ..ground.subcommands import run_subcommand, set_subcommand_handler


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rlhf-ext runs``'s actions (show, check, export) and their flags."""
    sub = parser.add_subparsers(dest="runs_command", metavar="ACTION")
    sub.required = True
    show = sub.add_parser("show", help="summary of a run directory: status, last step, key metrics, incidents",
                          description="Print a short summary of RUN_DIR: status (running / finished / "
                                      "stopped_by_guard / crashed), last step, first and last value of key "
                                      "metrics, guard incidents, checkpoints. Example: rlhf-ext runs show runs/r1")
    show.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds config.json / metrics.jsonl)")
    set_subcommand_handler(show, _run_runs_show)
    check = sub.add_parser(
        "check",
        help="smoke verdict of a run: ended, finite, ratio near 1, advantages alive, reward direction, mismatch",
        description="One line per check (PASS / FAIL / SKIP, or N/A: a reward trend too short to judge, which "
                    "does not fail), then the verdict; exit code 0 when no check failed, "
                    "1 when one did, 2 when RUN_DIR is not a run record. Meant for a 20-step smoke run before "
                    "the long one, e.g. as a command of a queue suite. Checks and thresholds: docs/run_records.md. "
                    "Example: rlhf-ext runs check runs/smoke/ckpt/rlhf_ext_run",
    )
    check.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds config.json / metrics.jsonl)")
    check.add_argument("--window", type=int, default=5, metavar="K",
                       help="first / last K steps compared for the reward and the advantage checks (default 5)")
    check.add_argument("--max-ppo-kl", type=float, default=0.02, metavar="X",
                       help="largest |train/ppo_kl| of a step for the importance ratio to count as near 1 "
                            "(default 0.02)")
    check.add_argument("--max-zero-variance", type=float, default=0.9, metavar="FRAC",
                       help="share of zero-variance prompt groups over the last K steps at which the advantages "
                            "count as collapsed (default 0.9)")
    check.add_argument("--mismatch-threshold", type=float, default=None, metavar="X",
                       help="limit on rollout_mismatch/probs_diff_mean (default: the run's "
                            "--rlhf_ext.mismatch_threshold, else 0.005)")
    check.add_argument("--require-rise", action="store_true",
                       help="fail unless the reward rises by more than 2 standard errors (default: fail only "
                            "when it falls)")
    check.add_argument("--json", action="store_true", help="print the verdict as JSON instead of lines")
    set_subcommand_handler(check, _run_runs_check)
    export = sub.add_parser(
        "export",
        help="convert an older run's TensorBoard event files into a run directory (metrics.jsonl)",
        description="Read the scalars OpenRLHF wrote with --logger.tensorboard_dir and write them in the "
                    "metrics.jsonl form of a live run (same metric names), so older runs can be compared. "
                    "Example: rlhf-ext runs export --tensorboard logs/tb/run1 --output runs/run1",
    )
    export.add_argument("--tensorboard", required=True, metavar="DIR",
                        help="directory holding one run's events.out.tfevents.* files (searched recursively)")
    export.add_argument("--output", default=None, metavar="RUN_DIR",
                        help="run directory to write (default: DIR/rlhf_ext_run); must not hold a metrics.jsonl")
    export.add_argument("--name", default=None, help="run name in config.json (default: the event directory's name)")
    set_subcommand_handler(export, _run_runs_export)


def run(args) -> int:
    return run_subcommand(args)


def _run_runs_show(args) -> int:
    from .summary import summarize

    try:
        print(summarize(args.run_dir))
    except (FileNotFoundError, ValueError) as exc:
        print(f"rlhf-ext runs show: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _run_runs_check(args) -> int:
    import json

    from .check import CheckOptions, check_run

    for flag, value in (("--window", args.window), ("--max-ppo-kl", args.max_ppo_kl),
                        ("--max-zero-variance", args.max_zero_variance)):
        if not value > 0:
            print(f"rlhf-ext runs check: error: {flag} must be > 0, got {value}", file=sys.stderr)
            return 2
    options = CheckOptions(window=args.window, max_ppo_kl=args.max_ppo_kl, max_zero_variance=args.max_zero_variance,
                           require_rise=args.require_rise, mismatch_threshold=args.mismatch_threshold)
    try:
        verdict = check_run(args.run_dir, options)
    except (FileNotFoundError, ValueError) as exc:
        print(f"rlhf-ext runs check: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(verdict.to_dict(), indent=2) if args.json else "\n".join(verdict.lines()))
    return 0 if verdict.passed else 1


def _run_runs_export(args) -> int:
    from pathlib import Path

    from .tensorboard import export_tensorboard

    output = Path(args.output) if args.output else Path(args.tensorboard) / "rlhf_ext_run"
    try:
        result = export_tensorboard(args.tensorboard, output, name=args.name)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"rlhf-ext runs export: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {result['steps']} steps, {result['metrics']} metrics to {result['output']}")
    return 0
