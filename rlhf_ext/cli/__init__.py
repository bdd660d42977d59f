"""The ``rlhf-ext`` command: one subcommand per tool.

Every subcommand is one row of ``_SUBCOMMANDS``: its name, the module that declares its flags
(``add_arguments(parser)``) and runs it (``run(args) -> int``), and the few words the parser shows
before that module is imported (``help``, ``description``). Only the module of the subcommand
being run is imported, so ``rlhf-ext --help`` and each command stay fast; :func:`build_parser`
with no argument declares every subcommand's flags (tests, documentation). A new tool adds its
row. The dispatch (the table, the handler, forwarded arguments) is :mod:`rlhf_ext.ground.subcommands`,
which ``evalkit`` shares. ``python -m rlhf_ext.cli`` is the same command; the argument types the tools share are in
:mod:`rlhf_ext.ground.argtypes` (below the tools that use them).
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Optional

from ..ground import subcommands

_RAW = argparse.RawDescriptionHelpFormatter

# name -> (module with add_arguments / run, add_parser keywords). A module whose docstring is the
# description says so with description=None (the docstring is read once the module is imported).
_SUBCOMMANDS: Dict[str, tuple] = {
    "reward-server": ("rlhf_ext.rewards.server", dict(
        help="serve math rewards over HTTP for OpenRLHF's --reward.remote_url",
        description=(
            "Serve rule rewards over HTTP with OpenRLHF's remote reward protocol: POST "
            '{"query": [...], "prompts": [...], "labels": [...]} to /get_reward and get '
            '{"rewards", "scores", "extra_logs"} back; GET /health for status. Point rollout actors '
            "on other nodes at it with --reward.remote_url http://HOST:PORT/get_reward. Flags not "
            "given fall back to the RLHF_EXT_REWARD* environment variables, then to the defaults. "
            "SIGINT/SIGTERM finish the requests in flight, then exit."
        ),
    )),
    "reward-file": ("rlhf_ext.rewards.reward_file", dict(
        help="print the path of the OpenRLHF reward file (for --reward.remote_url), or verl's with --verl",
        description="Print the absolute path of rlhf_ext's reward file for a training framework: OpenRLHF's, e.g. "
                    '--reward.remote_url "$(rlhf-ext reward-file)" (configure it with RLHF_EXT_REWARD*), or with '
                    "--verl verl's: reward.custom_reward_function.path=$(rlhf-ext reward-file --verl) "
                    "reward.custom_reward_function.name=compute_score. Same as python -m rlhf_ext.rewards.path.",
    )),
    "tiny-task": ("rlhf_ext.tours.tiny_task", dict(
        help="build the tiny arithmetic task and an SFT-warmed tiny model (smoke tests, no hub)",
        description=None, formatter_class=_RAW,
    )),
    # The smoke run owns its flags and parser: everything after `smoke` (--help included) goes to it.
    "smoke": (None, dict(
        add_help=False,
        help="the whole story on CPU: tiny task -> evaluate -> GRPO through OpenRLHF -> evaluate",
        description="Same as python -m rlhf_ext.tours.smoke; run 'rlhf-ext smoke --help' for its flags.",
    )),
    "runs": ("rlhf_ext.runs.cli", dict(
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
        formatter_class=_RAW,
    )),
    "report": ("rlhf_ext.report.cli", dict(
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
        formatter_class=_RAW,
    )),
    "data": ("rlhf_ext.data.cli", dict(
        help="data tools between RL stages: sample, filter, pairs, sft, clean (docs/data.md)",
        description="Curate training data with the current model: sample every prompt N times and grade it, keep "
                    "the prompts worth training on, build DPO pairs and rejection-sampling SFT sets, clean and "
                    "decontaminate. 'rlhf-ext data COMMAND --help' shows each command with an example.",
    )),
    "alignment": ("rlhf_ext.alignment", dict(
        help="offline check: do vLLM and the training forward agree on token probabilities (per dtype)?",
        description=None, formatter_class=_RAW,
    )),
    "queue": ("rlhf_ext.queue.cli", dict(
        help="run a suite of training runs one after another, with a snapshot and a manifest",
        description="Run the runs of a suite file one at a time (snapshot of code, suite and inputs first; "
                    "manifest.json rewritten atomically), show a queue's state, or stop its runner.",
        formatter_class=_RAW,
    )),
}


def _declare(parser: argparse.ArgumentParser, module_name: Optional[str]) -> None:
    """The tool's own flags, and its ``run`` as the handler (``smoke``: its arguments, forwarded)."""
    if module_name is None:
        parser.add_argument("smoke_args", nargs=argparse.REMAINDER)
        subcommands.forward_unknown_args(parser, "smoke_args")
        parser.set_defaults(**{subcommands.HANDLER: _run_smoke})
        return
    subcommands.declare(parser, module_name)


def _run_smoke(args: argparse.Namespace) -> int:
    from ..tours.smoke import main as smoke_main

    return smoke_main(args.smoke_args)


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The ``rlhf-ext`` parser; with ``command``, only that subcommand's flags are declared (and only
    its module imported): the others are listed by name and help."""
    parser = argparse.ArgumentParser(
        prog="rlhf-ext",
        description="rlhf_ext tools for RL fine-tuning with OpenRLHF (and friends).",
    )
    subcommands.add_subcommands(parser, _SUBCOMMANDS, command, declare=_declare)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    # The subcommand is the first word that is not an option (the top level has only -h).
    command = next((arg for arg in argv if not arg.startswith("-")), "")
    return subcommands.run(subcommands.parse(build_parser(command), argv))
