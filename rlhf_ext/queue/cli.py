"""``rlhf-ext queue ACTION``: run a suite of training runs one after another, show a queue, stop it,
compare its runs on one page (docs/queue.md). The flags are declared here; :mod:`rlhf_ext.cli` only
names the subcommand."""

from __future__ import annotations

import argparse
import sys

from ..ground.argtypes import positive_seconds
from ..ground.subcommands import run_subcommand, set_subcommand_handler

EPILOG = """\
examples:
  rlhf-ext tiny-task --output runs/tiny
  rlhf-ext queue run examples/suites/eight_algorithms_tiny.toml --output runs/q8 --dry-run
  rlhf-ext queue run examples/suites/eight_algorithms_tiny.toml --output runs/q8
  rlhf-ext queue status runs/q8
  rlhf-ext queue stop runs/q8                  # or Ctrl-C in the runner's terminal
  rlhf-ext queue report runs/q8                # runs/q8/report.html: every run on one page
  rlhf-ext queue run examples/suites/eight_algorithms_tiny.toml --output runs/q8 --retry-failed

Rules: the output directory is new, or this queue's own (to continue after the done runs); one run
at a time; the first failure stops the queue; a run is done only if every command exited 0 and
every path of its 'expect' exists. See docs/queue.md.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rlhf-ext queue``'s actions (run, status, stop, report) and their flags."""
    parser.epilog = EPILOG
    sub = parser.add_subparsers(dest="queue_command", metavar="ACTION")
    sub.required = True
    run_parser = sub.add_parser("run", help="run (or continue) a suite", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Run the suite's runs in order into --output; rerun the same "
                                            "command to continue after the done runs.")
    run_parser.add_argument("suite", help="suite file (TOML), e.g. examples/suites/eight_algorithms_tiny.toml")
    run_parser.add_argument("--output", required=True, help="queue directory: new, or this queue's own to continue it")
    run_parser.add_argument("--dry-run", action="store_true",
                            help="print every command with its resolved paths, check the inputs exist; run nothing")
    run_parser.add_argument("--retry-failed", action="store_true",
                            help="run failed / interrupted runs again (the old attempt is kept as runs/NAME.attemptK)")
    run_parser.add_argument("--ray-address", default=None, metavar="ADDR",
                            help="submit each command to this Ray cluster with 'ray job submit' and follow it "
                                 "(e.g. http://head:8265)")
    run_parser.add_argument("--set", dest="sets", action="append", default=None, metavar="KEY=VALUE",
                            help="override a suite variable, repeatable (e.g. --set tiny=runs/tiny)")
    run_parser.add_argument("--only", default=None, metavar="RUN,RUN",
                            help="run only these runs of the suite (comma-separated names), in suite order")
    set_subcommand_handler(run_parser, _run_queue_run)
    st = sub.add_parser("status", help="print a queue's runs, statuses, exit codes and reasons")
    st.add_argument("output", help="queue directory")
    set_subcommand_handler(st, _run_queue_status)
    sp = sub.add_parser("stop", help="stop a queue's runner: its running command is killed, the run marked "
                                     "interrupted")
    sp.add_argument("output", help="queue directory")
    sp.add_argument("--wait", type=positive_seconds, default=60.0,
                    help="seconds to wait for the runner to finish stopping (default: 60)")
    set_subcommand_handler(sp, _run_queue_stop)
    rp = sub.add_parser("report", help="one HTML page comparing the queue's runs (rlhf-ext report over every "
                                       "run record, named as in the suite, with their evaluations)")
    rp.add_argument("output", help="queue directory")
    rp.add_argument("-o", "--html", default=None, help="HTML file to write (default: <queue directory>/report.html)")
    rp.add_argument("--title", default=None, help="page title (default: '<suite>: N runs')")
    set_subcommand_handler(rp, _run_queue_report)


def run(args) -> int:
    return run_subcommand(args)


def _queue_errors():
    from . import ManifestError, QueueError, QueueLockedError, SuiteError

    return (ManifestError, QueueError, QueueLockedError, SuiteError)


def _run_queue_run(args) -> int:
    from . import dry_run, run_queue

    only = [n for n in args.only.split(",") if n] if args.only else None
    try:
        if args.dry_run:
            return dry_run(args.suite, args.output, sets=args.sets, only=only, ray_address=args.ray_address)
        return run_queue(args.suite, args.output, sets=args.sets, only=only, retry_failed=args.retry_failed,
                         ray_address=args.ray_address)
    except _queue_errors() as exc:
        print(f"rlhf-ext queue: error: {exc}", file=sys.stderr)
        return 2


def _run_queue_status(args) -> int:
    from . import status

    try:
        return status(args.output)
    except _queue_errors() as exc:
        print(f"rlhf-ext queue: error: {exc}", file=sys.stderr)
        return 2


def _run_queue_report(args) -> int:
    from . import report

    try:
        return report(args.output, args.html, title=args.title)
    except _queue_errors() as exc:
        print(f"rlhf-ext queue: error: {exc}", file=sys.stderr)
        return 2


def _run_queue_stop(args) -> int:
    from . import stop

    try:
        return stop(args.output, wait=args.wait)
    except _queue_errors() as exc:
        print(f"rlhf-ext queue: error: {exc}", file=sys.stderr)
        return 2
