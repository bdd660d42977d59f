"""``rlhf-ext report RUN_DIR...``: the flags of the one-page comparison of RL runs, and the command
(docs/report.md). :mod:`rlhf_ext.cli` only names the subcommand."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories to compare (the first is the baseline)")
    parser.add_argument("--evals", nargs="+", default=[], metavar="EVAL_DIR",
                        help="evalkit output directories, or directories containing them")
    parser.add_argument("--names", default=None, help="comma-separated display names, one per RUN_DIR (default: recorded names)")
    parser.add_argument("-o", "--output", default="report.html", help="HTML file to write (default: report.html)")
    parser.add_argument("--title", default=None, help="page title (default: 'RL runs: <names>')")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--min-effect", type=float, default=None, metavar="POINTS",
                        help="smallest avg@n / maj@n difference, in points, that counts as better / worse (default: the "
                             "seed spread of the seed groups' evaluations plus the grader error rate of any evalkit audit)")


def run(args) -> int:
    import shlex

    from ..evalkit.records import RunDirError
    from . import EvalDirError, RunRecordError, write_report

    names = None
    if args.names is not None:
        names = [n.strip() for n in args.names.split(",")]
        if any(not n for n in names):
            print(f"rlhf-ext report: error: --names {args.names!r} has an empty name", file=sys.stderr)
            return 2
    command = shlex.join(["rlhf-ext", "report", *args.run_dirs, *(["--evals", *args.evals] if args.evals else []),
                          *(["--names", args.names] if names else []), "-o", args.output])
    if args.min_effect is not None and not args.min_effect >= 0:
        print(f"rlhf-ext report: error: --min-effect must be >= 0 points, got {args.min_effect}", file=sys.stderr)
        return 2
    try:
        out = write_report(args.run_dirs, args.output, eval_dirs=args.evals, names=names, title=args.title,
                           quiet=args.quiet, command=command, min_effect_points=args.min_effect)
    except (RunRecordError, EvalDirError, RunDirError) as exc:
        print(f"rlhf-ext report: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"rlhf-ext report: error: {exc}; install plotly (pip install 'rlhf_ext[report]')", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"rlhf-ext report: error: {exc}", file=sys.stderr)  # unreadable input or unwritable output
        return 1
    print(out)
    return 0
