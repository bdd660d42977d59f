"""The ``evalkit`` command line (also ``python -m rlhf_ext.evalkit``).

Every subcommand is one row of :data:`SUBCOMMANDS`, as ``rlhf-ext``'s are: its name, the module that
declares its flags (``add_arguments(parser)``) and runs it (``run(args) -> int``), and the words the
parser shows before that module is imported; :mod:`rlhf_ext.ground.subcommands` dispatches both
commands. The modules: :mod:`.commands` (``TASK``, ``run``, ``list``, ``report``, ``compare``),
:mod:`.audit` and :mod:`.sweep`. A new subcommand adds its row (and its line in :data:`OVERVIEW`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, Optional, Sequence

from ..ground import subcommands
from .commands import CUSTOM_EPILOG, EPILOG
from .records import RunDirError
from .tasks import SUITES, DataError
from .templates import TemplateError

_RAW = argparse.RawDescriptionHelpFormatter

# name -> (module with add_arguments / run, add_parser keywords); `defaults` are set on the parsed
# arguments (every built-in task is one row of the same module, told its task).
SUBCOMMANDS: Dict[str, tuple] = {
    **{suite: ("rlhf_ext.evalkit.commands.evaluate", dict(
        help=f"evaluate a model on {suite}",
        description=f"Evaluate a model on {suite} with vLLM: sample, grade, summarize.",
        epilog=EPILOG, formatter_class=_RAW, defaults={"suite": suite},
    )) for suite in SUITES},
    "run": ("rlhf_ext.evalkit.commands.custom", dict(
        help="evaluate a model on any JSONL of problems and answers",
        description="Evaluate a model on any JSONL of problems with gold answers.",
        epilog=CUSTOM_EPILOG + "\n" + EPILOG.split("\n\n", 1)[1], formatter_class=_RAW,
    )),
    "list": ("rlhf_ext.evalkit.commands.listing", dict(
        help="tasks, sources, sizes, answer formats",
        description="Tasks, their sources, sizes and answer formats.",
    )),
    "report": ("rlhf_ext.evalkit.commands.report", dict(
        help="summary of a run",
        description="Recompute and print the summary of a run directory from its samples (works on unfinished "
                    "runs too).",
    )),
    "compare": ("rlhf_ext.evalkit.commands.compare", dict(
        help="paired differences against the first run",
        description="Compare runs against the first one, per task: paired difference of avg@n and maj@n over "
                    "the problems both runs have, with a bootstrap 95%% interval; a difference whose interval "
                    "excludes 0 is distinguishable from noise.",
    )),
    "audit": ("rlhf_ext.evalkit.audit", dict(
        help="hand-check a stratified sample: the grader's error rate",
        description="Draw a stratified sample of an evaluation's graded answers (by task and grade), record the "
                    "verdicts a person types (or --verdicts FILE), and report the grader's error rate with a 95%% "
                    "interval in RUN_DIR/audit.json (used by 'evalkit compare' and 'rlhf-ext report' for the "
                    "minimum effect). Rerun to continue judging.",
    )),
    "sweep": ("rlhf_ext.evalkit.sweep", dict(
        help="every checkpoint of a training run",
        description="Evaluate the starting model, every checkpoint (Hugging Face exports, --ckpt.save_hf) and "
                    "the final model of a training run with one protocol, into OUTPUT/step_<N>; rerun to continue "
                    "(complete steps are skipped). Options after the task are evalkit's run options, e.g. "
                    "--n-samples 8 --template r1-zero --data test.jsonl.",
        epilog="example: evalkit sweep runs/grpo/ckpt/rlhf_ext_run gsm8k --output runs/grpo/evals -- "
               "--data gsm8k_test.jsonl --n-samples 4 --template r1-zero",
    )),
}

OVERVIEW = """\
usage: evalkit {{{commands}}} [options]

Math benchmark evaluation on vLLM with many samples per problem, honest statistics
(bootstrap intervals over problems, paired comparisons), per-sample records and resume.

  evalkit TASK --model PATH [options]   run (TASK: {suites})
  evalkit run --data FILE --name NAME   run on any JSONL of problems and answers
  evalkit list                          tasks, sources, sizes, answer formats
  evalkit report RUN_DIR                summary of a run
  evalkit compare RUN_A RUN_B [...]     paired differences against RUN_A
  evalkit audit RUN_DIR --n 50          hand-check a stratified sample: the grader's error rate
  evalkit sweep RUN_RECORD TASK --output DIR [options]   every checkpoint of a training run

'evalkit TASK --help' lists the run options.

"""


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The ``evalkit`` parser; with ``command``, only that subcommand's flags are declared (and only its
    module imported). ``evalkit --help`` is :data:`OVERVIEW`, printed by :func:`main`."""
    parser = argparse.ArgumentParser(prog="evalkit", description=__doc__.split("\n", 1)[0])
    subcommands.add_subcommands(parser, SUBCOMMANDS, command)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ", ".join(SUBCOMMANDS)
    if not argv or argv[0] in ("-h", "--help"):
        print(OVERVIEW.format(commands=commands, suites=", ".join(SUITES)) + EPILOG)
        return 0 if argv else 2
    command = argv[0]
    if command not in SUBCOMMANDS:
        print(f"evalkit: unknown command {command!r}; choose from {commands}", file=sys.stderr)
        return 2
    try:
        return subcommands.run(subcommands.parse(build_parser(command), argv))
    except (DataError, RunDirError, TemplateError, ValueError) as exc:
        print(f"evalkit: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
