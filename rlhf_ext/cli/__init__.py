"""The ``rlhf-ext`` command: one subcommand per tool.

Each subcommand lives in a ``_add_<name>(subparsers)`` function that declares its arguments and
sets ``handler``; add a new one by writing such a function and listing it in ``_SUBCOMMANDS``.
Handlers import their implementation lazily, so ``rlhf-ext --help`` stays fast.
``python -m rlhf_ext.cli`` is the same command; the argument types the subcommands share are in
:mod:`rlhf_ext.argtypes` (below the tools that use them too).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from ..argtypes import port as _port, positive_int as _positive_int, positive_seconds as _positive_seconds


# --- reward-server -------------------------------------------------------------------------------


def _add_reward_server(subparsers) -> None:
    p = subparsers.add_parser(
        "reward-server",
        help="serve math rewards over HTTP for OpenRLHF's --reward.remote_url",
        description=(
            "Serve rule rewards over HTTP with OpenRLHF's remote reward protocol: POST "
            '{"query": [...], "prompts": [...], "labels": [...]} to /get_reward and get '
            '{"rewards", "scores", "extra_logs"} back; GET /health for status. Point rollout actors '
            "on other nodes at it with --reward.remote_url http://HOST:PORT/get_reward. Flags not "
            "given fall back to the RLHF_EXT_REWARD* environment variables, then to the defaults. "
            "SIGINT/SIGTERM finish the requests in flight, then exit."
        ),
    )
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; 0.0.0.0 to serve other nodes (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=5000,
                   help="port to bind; 0 = any free port, printed at start (default: 5000)")
    p.add_argument("--workers", type=_positive_int, default=None,
                   help="grader worker processes (default: RLHF_EXT_REWARD_WORKERS, else min(CPUs, 8))")
    p.add_argument("--timeout", type=_positive_seconds, default=None,
                   help="hard time limit per sample in seconds (default: RLHF_EXT_REWARD_TIMEOUT, else 5)")
    p.add_argument("--reward", default=None,
                   help="weighted spec like 'accuracy:1.0,format:0.2,truncation:-0.5' or a preset: math, open_r1 "
                        "(default: RLHF_EXT_REWARD, else math)")
    p.add_argument("--max-pending", type=_positive_int, default=1024,
                   help="requests admitted at once; more get 503 + Retry-After (default: 1024)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="log level (default: INFO)")
    p.set_defaults(handler=_run_reward_server)


def _run_reward_server(args: argparse.Namespace) -> int:
    import dataclasses

    from ..rewards.config import reward_config_from_env
    from ..rewards.server import serve

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = reward_config_from_env()
        overrides = {k: v for k, v in (("reward", args.reward), ("timeout", args.timeout),
                                       ("workers", args.workers)) if v is not None}
        config = dataclasses.replace(config, **overrides).validate()
    except ValueError as exc:
        print(f"rlhf-ext reward-server: error: {exc}", file=sys.stderr)
        return 2

    def ready(server) -> None:
        print(f"rlhf-ext reward-server: listening on {server.url} (POST /get_reward, GET /health); "
              f"reward={config.reward} timeout={config.timeout:g}s", flush=True)

    try:
        serve(config, args.host, args.port, max_pending=args.max_pending, on_ready=ready)
    except OSError as exc:
        print(f"rlhf-ext reward-server: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


# --- reward-file ---------------------------------------------------------------------------------


def _add_reward_file(subparsers) -> None:
    # declared here rather than imported from rlhf_ext.rewards.path: importing the rewards package
    # (its grader) would add a second or more to every rlhf-ext command; tests/test_cli.py checks
    # that both entrances offer the same flags
    p = subparsers.add_parser(
        "reward-file",
        help="print the path of the OpenRLHF reward file (for --reward.remote_url), or verl's with --verl",
        description="Print the absolute path of rlhf_ext's reward file for a training framework: OpenRLHF's, e.g. "
                    '--reward.remote_url "$(rlhf-ext reward-file)" (configure it with RLHF_EXT_REWARD*), or with '
                    "--verl verl's: reward.custom_reward_function.path=$(rlhf-ext reward-file --verl) "
                    "reward.custom_reward_function.name=compute_score. Same as python -m rlhf_ext.rewards.path.",
    )
    p.add_argument("--verl", action="store_true",
                   help="the verl reward file (its function is compute_score) instead of OpenRLHF's")
    p.set_defaults(handler=_run_reward_file)


def _run_reward_file(args: argparse.Namespace) -> int:
    from ..rewards.path import run

    return run(args)


# --- tiny-task / smoke ---------------------------------------------------------------------------


def _add_tiny_task(subparsers) -> None:
    from ..tours.tiny_task import __doc__ as doc, add_arguments

    p = subparsers.add_parser(
        "tiny-task",
        help="build the tiny arithmetic task and an SFT-warmed tiny model (smoke tests, no hub)",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(handler=_run_tiny_task)


def _run_tiny_task(args: argparse.Namespace) -> int:
    from ..tours.tiny_task import run

    return run(args)


def _add_smoke(subparsers) -> None:
    # The smoke run owns its flags; forward everything (including --help) to it.
    p = subparsers.add_parser(
        "smoke",
        add_help=False,
        help="the whole story on CPU: tiny task -> evaluate -> GRPO through OpenRLHF -> evaluate",
        description="Same as python -m rlhf_ext.tours.smoke; run 'rlhf-ext smoke --help' for its flags.",
    )
    p.add_argument("smoke_args", nargs=argparse.REMAINDER)
    p.set_defaults(handler=_run_smoke)


def _run_smoke(args: argparse.Namespace) -> int:
    from ..tours.smoke import main as smoke_main

    return smoke_main(args.smoke_args)


# --- queue ---------------------------------------------------------------------------------------


_QUEUE_EPILOG = """\
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


def _add_queue(subparsers) -> None:
    p = subparsers.add_parser(
        "queue",
        help="run a suite of training runs one after another, with a snapshot and a manifest",
        description="Run the runs of a suite file one at a time (snapshot of code, suite and inputs first; "
                    "manifest.json rewritten atomically), show a queue's state, or stop its runner.",
        epilog=_QUEUE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="queue_command", metavar="ACTION")
    sub.required = True
    run = sub.add_parser("run", help="run (or continue) a suite", epilog=_QUEUE_EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Run the suite's runs in order into --output; rerun the same command to "
                                     "continue after the done runs.")
    run.add_argument("suite", help="suite file (TOML), e.g. examples/suites/eight_algorithms_tiny.toml")
    run.add_argument("--output", required=True, help="queue directory: new, or this queue's own to continue it")
    run.add_argument("--dry-run", action="store_true",
                     help="print every command with its resolved paths, check the inputs exist; run nothing")
    run.add_argument("--retry-failed", action="store_true",
                     help="run failed / interrupted runs again (the old attempt is kept as runs/NAME.attemptK)")
    run.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="submit each command to this Ray cluster with 'ray job submit' and follow it "
                          "(e.g. http://head:8265)")
    run.add_argument("--set", dest="sets", action="append", default=None, metavar="KEY=VALUE",
                     help="override a suite variable, repeatable (e.g. --set tiny=runs/tiny)")
    run.add_argument("--only", default=None, metavar="RUN,RUN",
                     help="run only these runs of the suite (comma-separated names), in suite order")
    run.set_defaults(handler=_run_queue_run)
    st = sub.add_parser("status", help="print a queue's runs, statuses, exit codes and reasons")
    st.add_argument("output", help="queue directory")
    st.set_defaults(handler=_run_queue_status)
    sp = sub.add_parser("stop", help="stop a queue's runner: its running command is killed, the run marked "
                                     "interrupted")
    sp.add_argument("output", help="queue directory")
    sp.add_argument("--wait", type=_positive_seconds, default=60.0,
                    help="seconds to wait for the runner to finish stopping (default: 60)")
    sp.set_defaults(handler=_run_queue_stop)
    rp = sub.add_parser("report", help="one HTML page comparing the queue's runs (rlhf-ext report over every "
                                       "run record, named as in the suite, with their evaluations)")
    rp.add_argument("output", help="queue directory")
    rp.add_argument("-o", "--html", default=None, help="HTML file to write (default: <queue directory>/report.html)")
    rp.add_argument("--title", default=None, help="page title (default: '<suite>: N runs')")
    rp.set_defaults(handler=_run_queue_report)


def _queue_errors():
    from ..queue import ManifestError, QueueError, QueueLockedError, SuiteError

    return (ManifestError, QueueError, QueueLockedError, SuiteError)


def _run_queue_run(args: argparse.Namespace) -> int:
    from ..queue import dry_run, run_queue

    only = [n for n in args.only.split(",") if n] if args.only else None
    try:
        if args.dry_run:
            return dry_run(args.suite, args.output, sets=args.sets, only=only, ray_address=args.ray_address)
        return run_queue(args.suite, args.output, sets=args.sets, only=only, retry_failed=args.retry_failed,
                         ray_address=args.ray_address)
    except _queue_errors() as exc:
        print(f"rlhf-ext queue: error: {exc}", file=sys.stderr)
        return 2


def _run_queue_status(args: argparse.Namespace) -> int:
    from ..queue import status

    try:
        return status(args.output)
    except _queue_errors() as exc:
        print(f"rlhf-ext queue: error: {exc}", file=sys.stderr)
        return 2


def _run_queue_report(args: argparse.Namespace) -> int:
    from ..queue import report

    try:
        return report(args.output, args.html, title=args.title)
    except _queue_errors() as exc:
        print(f"rlhf-ext queue: error: {exc}", file=sys.stderr)
        return 2


def _run_queue_stop(args: argparse.Namespace) -> int:
    from ..queue import stop

    try:
        return stop(args.output, wait=args.wait)
    except _queue_errors() as exc:
        print(f"rlhf-ext queue: error: {exc}", file=sys.stderr)
        return 2


# --- report --------------------------------------------------------------------------------------


def _add_report(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="one offline HTML page comparing RL runs (training dynamics, evals, incidents)",
        description=(
            "Write ONE self-contained HTML file (plotly inlined; opens offline by double-click) that\n"
            "compares RL runs: the run table with the configuration keys that differ, headline sentences,\n"
            "all runs' training dynamics overlaid (step or wall-clock x axis, moving-average window),\n"
            "evaluation over checkpoints from evalkit output directories with bootstrap bands and paired\n"
            "comparisons, and incidents.\n\n"
            "RUN_DIR is a run record (config.json, metrics.jsonl, events.jsonl), written by runs with\n"
            "--plugin rlhf_ext. See docs/report.md.\n"
        ),
        epilog=(
            "example:\n  rlhf-ext report runs/grpo runs/dr_grpo --evals evals/ --names GRPO,Dr.GRPO -o report.html\n"
            "--evals takes evalkit output directories or folders holding them; each is placed on the run\n"
            "and step of the checkpoint it evaluated (starting model: step 0)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories to compare (the first is the baseline)")
    p.add_argument("--evals", nargs="+", default=[], metavar="EVAL_DIR",
                   help="evalkit output directories, or directories containing them")
    p.add_argument("--names", default=None, help="comma-separated display names, one per RUN_DIR (default: recorded names)")
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write (default: report.html)")
    p.add_argument("--title", default=None, help="page title (default: 'RL runs: <names>')")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--min-effect", type=float, default=None, metavar="POINTS",
                   help="smallest avg@n / maj@n difference, in points, that counts as better / worse (default: the "
                        "seed spread of the seed groups' evaluations plus the grader error rate of any evalkit audit)")
    p.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    import shlex

    from ..evalkit.records import RunDirError
    from ..report import EvalDirError, RunRecordError, write_report

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


# --- data ----------------------------------------------------------------------------------------


def _add_data(subparsers) -> None:
    from ..data.cli import add_data_commands

    p = subparsers.add_parser(
        "data",
        help="data tools between RL stages: sample, filter, pairs, sft, clean (docs/data.md)",
        description="Curate training data with the current model: sample every prompt N times and grade it, keep "
                    "the prompts worth training on, build DPO pairs and rejection-sampling SFT sets, clean and "
                    "decontaminate. 'rlhf-ext data COMMAND --help' shows each command with an example.",
    )
    sub = p.add_subparsers(dest="data_command", metavar="COMMAND")
    sub.required = True
    add_data_commands(sub)
    p.set_defaults(handler=_run_data)


def _run_data(args: argparse.Namespace) -> int:
    from ..data.cli import run

    return run(args)


# --- alignment -----------------------------------------------------------------------------------


def _add_alignment(subparsers) -> None:
    from ..alignment import __doc__ as doc, add_arguments

    p = subparsers.add_parser(
        "alignment",
        help="offline check: do vLLM and the training forward agree on token probabilities (per dtype)?",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(handler=_run_alignment)


def _run_alignment(args: argparse.Namespace) -> int:
    from ..alignment import run

    return run(args)


# --- runs ----------------------------------------------------------------------------------------


def _add_runs(subparsers) -> None:
    p = subparsers.add_parser(
        "runs",
        help="run records of OpenRLHF runs with --plugin rlhf_ext: show or check one, import TensorBoard logs",
        description=(
            "Run records (docs/run_records.md): every train_ppo_ray --plugin rlhf_ext run writes "
            "config.json, metrics.jsonl, events.jsonl (and incident.json after a guard stop) to "
            "--rlhf_ext.run_dir (default <--ckpt.path>/rlhf_ext_run).\n\n"
            "examples:\n"
            "  rlhf-ext runs show ckpt/checkpoints_ppo_ray/rlhf_ext_run\n"
            "  rlhf-ext runs check ckpt/checkpoints_ppo_ray/rlhf_ext_run     # smoke verdict, exit code 0/1\n"
            "  rlhf-ext runs export --tensorboard logs/tb/my_old_run --output runs/my_old_run"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="runs_command", metavar="ACTION")
    sub.required = True
    show = sub.add_parser("show", help="summary of a run directory: status, last step, key metrics, incidents",
                          description="Print a short summary of RUN_DIR: status (running / finished / "
                                      "stopped_by_guard / crashed), last step, first and last value of key "
                                      "metrics, guard incidents, checkpoints. Example: rlhf-ext runs show runs/r1")
    show.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds config.json / metrics.jsonl)")
    show.set_defaults(handler=_run_runs_show)
    check = sub.add_parser(
        "check",
        help="smoke verdict of a run: ended, finite, ratio near 1, advantages alive, reward direction, mismatch",
        description="One line per check (PASS / FAIL / SKIP), then the verdict; exit code 0 when no check failed, "
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
    check.set_defaults(handler=_run_runs_check)
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
    export.set_defaults(handler=_run_runs_export)


def _run_runs_show(args: argparse.Namespace) -> int:
    from ..runs import summarize

    try:
        print(summarize(args.run_dir))
    except (FileNotFoundError, ValueError) as exc:
        print(f"rlhf-ext runs show: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _run_runs_check(args: argparse.Namespace) -> int:
    import json

    from ..runcheck import CheckOptions, check_run

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


def _run_runs_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..runs import export_tensorboard

    output = Path(args.output) if args.output else Path(args.tensorboard) / "rlhf_ext_run"
    try:
        result = export_tensorboard(args.tensorboard, output, name=args.name)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"rlhf-ext runs export: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {result['steps']} steps, {result['metrics']} metrics to {result['output']}")
    return 0


_SUBCOMMANDS = (_add_reward_server, _add_reward_file, _add_tiny_task, _add_smoke, _add_runs, _add_report, _add_data,
                _add_alignment, _add_queue)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlhf-ext",
        description="rlhf_ext tools for RL fine-tuning with OpenRLHF (and friends).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add in _SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    # parse_known_args: argparse's REMAINDER does not capture a leading option such as `smoke --help`.
    args, extra = parser.parse_known_args(argv)
    if args.command == "smoke":
        args.smoke_args = extra + args.smoke_args
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.handler(args)

