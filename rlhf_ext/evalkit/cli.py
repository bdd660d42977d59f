"""The ``evalkit`` command line (also ``python -m rlhf_ext.evalkit``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from . import records
from .records import RunDirError, read_json
from .tasks import SUITES, TASKS, DataError
from .templates import BOXED_INSTRUCTION, TEMPLATES, TemplateError

EPILOG = """\
examples:
  evalkit aime --model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --tp 1 --dp 8
  evalkit math500 --model ckpt/step_200 --n-samples 4 --data ../shared/data/math500.jsonl
  evalkit report evalkit_runs/step_200/math500-1a2b3c4d5e
  evalkit compare runs/step_100 runs/step_200

Defaults follow the DeepSeek-R1 protocol: temperature 0.6, top_p 0.95, 32768 new tokens,
64 samples per problem, avg@64 (= pass@1) and maj@64 (cons@64) reported. Rerunning the same
command resumes into the same directory and generates only the missing samples.
"""

# Options a resumed run may take from its config.json when they are not given again.
_RESUMABLE = ("model", "n_samples", "temperature", "top_p", "top_k", "min_p", "max_tokens", "template",
              "system_prompt", "seed", "tp", "dp", "limit", "gpu_memory_utilization", "kv_cache", "enforce_eager",
              "max_model_len", "dtype", "shuffle_options")
_DEFAULTS = {"n_samples": 64, "temperature": 0.6, "top_p": 0.95, "top_k": -1, "min_p": 0.0, "max_tokens": 32768,
             "template": "r1",
             "seed": 0, "tp": 1, "dp": 1, "dtype": "auto"}


def _run_parser(name: str, help_text: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"evalkit {name}", description=help_text, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory or Hugging Face id (required unless --resume)")
    g = p.add_argument_group("sampling (DeepSeek-R1 protocol by default)")
    g.add_argument("--n-samples", type=int, help="samples per problem (default 64)")
    g.add_argument("--temperature", type=float, help="sampling temperature (default 0.6)")
    g.add_argument("--top-p", type=float, help="nucleus sampling top_p (default 0.95)")
    g.add_argument("--top-k", type=int, help="sample among the k most likely tokens; -1: off (default -1)")
    g.add_argument("--min-p", type=float, help="drop tokens below min_p x the top token's probability; 0: off "
                                               "(default 0)")
    g.add_argument("--max-tokens", type=int, help="max new tokens per sample (default 32768)")
    g.add_argument("--template", choices=TEMPLATES,
                   help="prompt template (default r1: the model's chat template, no system prompt, and "
                        f"'{BOXED_INSTRUCTION}' after the problem); qwen25-math-cot: Qwen2.5-Math's ChatML "
                        "prompt; chat: chat template with the bare problem; none: the bare problem")
    g.add_argument("--system-prompt", help="system prompt (chat templates only; default none)")
    g.add_argument("--template-file", type=Path, metavar="FILE",
                   help="a user template: plain text with one '{}' where the problem goes, no chat template (the "
                        "form of OpenRLHF's --data.input_template); sets --template file and is recorded")
    g.add_argument("--seed", type=int, help="base seed; sample i of a problem uses a seed derived from it, "
                                            "the task and the problem id, plus i (default 0)")
    g = p.add_argument_group("data")
    g.add_argument("--data", action="append", default=[], metavar="FILE|DIR|TASK=FILE",
                   help="local JSONL instead of the Hugging Face Hub: a file (single-task runs), TASK=FILE, or a "
                        "directory holding the usual file names (see 'evalkit list'); repeatable")
    g.add_argument("--limit", type=int, help="only the first N problems of each task (smoke runs)")
    g = p.add_argument_group("engine")
    g.add_argument("--tp", type=int, help="tensor parallel size per engine (default 1)")
    g.add_argument("--dp", type=int, help="data parallel engines, as Ray actors (default 1)")
    g.add_argument("--ray-address", help="existing Ray cluster for --dp (e.g. 'auto' after 'ray start'); "
                                         "default: a local Ray instance")
    g.add_argument("--gpu-memory-utilization", type=float,
                   help="vLLM memory fraction on GPU/NPU (default: vLLM's); not used on CPU, see --kv-cache")
    g.add_argument("--kv-cache", metavar="SIZE",
                   help="CPU only: vLLM's KV cache, e.g. 512MiB (default: from the model and --max-model-len, at "
                        "least 64 MiB; also $RLHF_EXT_VLLM_KV_CACHE)")
    g.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="disable graph capture/compilation (default: on for CPU only)")
    g.add_argument("--max-model-len", type=int, help="override the model's context length")
    g.add_argument("--dtype", help="model dtype for vLLM (default auto)")
    g.add_argument("--trust-remote-code", action="store_true", help="allow custom model code from the checkpoint")
    g = p.add_argument_group("output")
    g.add_argument("--output", type=Path, help="run directory (default evalkit_runs/<model>/<task>-<parameter hash>)")
    g.add_argument("--resume", action="store_true",
                   help="continue the run in --output: parameters not given are taken from its config.json; "
                        "only missing samples are generated")
    g.add_argument("--grader-workers", type=int, help="grading processes (default min(CPUs, 8))")
    g.add_argument("--grade-timeout", type=float, default=5.0, help="seconds per sample before grading gives up "
                                                                    "(scored wrong; default 5)")
    g.add_argument("--require-anchor", action=argparse.BooleanOptionalAction, default=None,
                   help="grade only answers stated with an anchor (\\boxed{}, 'the answer is', <answer>, ####), as "
                        "rlhf_ext's rewards do; default off: a response without one is graded on its last math "
                        "expression, as lighteval / math-verify (and published AIME / MATH-500 numbers) do. A "
                        "resumed run keeps its own setting")
    g.add_argument("--bootstrap-resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--verbose", action="store_true", help="keep vLLM's INFO logging")
    return p


def _options(suite: Optional[str], args: argparse.Namespace, custom: Optional[dict] = None):
    """Run options from the flags (and, with --resume, the run's config.json).

    ``custom``: the flags of a custom task (``evalkit run``); ``suite`` is then its name, or None
    to take it from the resumed run.
    """
    from .runner import RunOptions

    values = {k: getattr(args, k, None) for k in _RESUMABLE}
    require_anchor = args.require_anchor
    data = list(args.data)
    if args.resume:
        if args.output is None:
            raise RunDirError("--resume needs --output RUN_DIR")
        cfg_path = args.output / records.CONFIG_FILE
        if not cfg_path.exists():
            raise RunDirError(f"--resume: {args.output} holds no run (no {records.CONFIG_FILE})")
        cfg = read_json(cfg_path)
        if custom is not None:
            stored_custom = cfg.get("custom_task")
            if stored_custom is None:
                raise RunDirError(f"--resume: {args.output} holds a built-in {cfg.get('suite')!r} run; resume it "
                                  f"with 'evalkit {cfg.get('suite')} --resume --output {args.output}'")
            if suite is None:
                suite = stored_custom["name"]
            for key in ("problem_key", "answer_key", "id_key", "answer_type"):
                if custom.get(key) is None:
                    custom[key] = stored_custom.get(key)
            custom["name"] = suite
        if cfg.get("suite") != suite:
            raise RunDirError(f"--resume: {args.output} holds a {cfg.get('suite')!r} run, not {suite!r}")
        stored = {**cfg.get("generation", {}), **cfg.get("engine", {}), "n_samples": cfg.get("n_samples"),
                  "limit": cfg.get("limit")}
        stored["tp"], stored["dp"] = cfg.get("engine", {}).get("tp"), cfg.get("engine", {}).get("dp")
        for key in _RESUMABLE:
            if values[key] is None and stored.get(key) is not None:
                values[key] = stored[key]
        if require_anchor is None:  # runs from before the option were graded with the anchor required
            require_anchor = bool(cfg.get("grading", {}).get("require_anchor", True))
        if not data and custom is not None:
            data = [d["source"] for d in cfg.get("datasets", {}).values()]
        elif not data:
            data = [f"{t}={d['source']}" for t, d in cfg.get("datasets", {}).items()
                    if not str(d.get("source", "")).startswith("hub:")]
    if not values["model"]:
        raise ValueError("--model is required")
    if custom is not None:
        if suite is None:
            raise ValueError("--name is required (the task's name in records, reports and comparisons)")
        if len(data) != 1 or Path(data[0]).is_dir():
            raise ValueError("evalkit run needs exactly one --data FILE.jsonl")
        custom["name"] = suite
        custom["answer_type"] = custom.get("answer_type") or "math"
    template_text = None
    if getattr(args, "template_file", None) is not None:
        if values["template"] not in (None, "file"):
            raise ValueError(f"--template-file goes with --template file (or no --template), not {values['template']}")
        try:
            template_text = args.template_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--template-file {args.template_file}: {exc.strerror or exc}") from None
        values["template"] = "file"
    elif values["template"] == "file" and args.resume:
        template_text = read_json(args.output / records.CONFIG_FILE).get("generation", {}).get("template_text")
    for key, default in _DEFAULTS.items():
        if values[key] is None:
            values[key] = default
    values["template_text"] = template_text
    return RunOptions(suite=suite, output=args.output, data=data, resume=args.resume, ray_address=args.ray_address,
                      trust_remote_code=args.trust_remote_code, grader_workers=args.grader_workers,
                      grade_timeout=args.grade_timeout, require_anchor=bool(require_anchor),
                      bootstrap_resamples=args.bootstrap_resamples,
                      progress=not args.no_progress, custom_task=custom, **values)


CUSTOM_EPILOG = """\
examples:
  evalkit run --model ckpt/step_200 --data my_problems.jsonl --name my_task --n-samples 8
  evalkit run --model M --data train.jsonl --name train --problem-key prompt --answer-key label --template chat
  evalkit run --resume --output evalkit_runs/step_200/my_task-1a2b3c4d5e

Any JSONL with one problem and its gold answer per line is a task: the same records, metrics,
resume and 'evalkit compare' as the built-in benchmarks, under the name given by --name. Without
--problem-key/--answer-key/--id-key the usual fields are tried (problem/question, answer, id/
unique_id/idx; no id field: the line number is the id).
"""


def _custom_parser() -> argparse.ArgumentParser:
    p = _run_parser("run", "Evaluate a model on any JSONL of problems with gold answers.")
    p.epilog = CUSTOM_EPILOG + "\n" + EPILOG.split("\n\n", 1)[1]
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
    return p


def cmd_run(suite: Optional[str], argv: Sequence[str]) -> int:
    """``evalkit TASK ...`` (built-in) or, with ``suite=None``, ``evalkit run --data FILE --name NAME``."""
    if suite is None:
        args = _custom_parser().parse_args(argv)
        custom = {"name": args.name, "problem_key": args.problem_key, "answer_key": args.answer_key,
                  "id_key": args.id_key, "answer_type": args.answer_type}
        suite = args.name
    else:
        args = _run_parser(suite, f"Evaluate a model on {suite} with vLLM: sample, grade, summarize.").parse_args(argv)
        custom = None
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from .runner import EvalInterrupted, run_eval

    options = _options(suite, args, custom)
    try:
        output, summary = run_eval(options, log=lambda m: print(m, file=sys.stderr, flush=True))
    except EvalInterrupted as exc:
        print(f"evalkit: {exc}", file=sys.stderr)
        return 130
    print((output / records.SUMMARY_MD).read_text(encoding="utf-8"))
    print(f"run directory: {output}")
    return 0


def cmd_list(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="evalkit list", description="Tasks, their sources, sizes and answer formats.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    args = p.parse_args(argv)
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


def cmd_report(argv: Sequence[str]) -> int:
    from .summary import render_markdown, report

    p = argparse.ArgumentParser(prog="evalkit report", description="Recompute and print the summary of a run "
                                "directory from its samples (works on unfinished runs too).")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", action="store_true", help="print summary JSON instead of Markdown")
    args = p.parse_args(argv)
    summary = report(args.run_dir)
    print(json.dumps(summary, indent=2) if args.json else render_markdown(summary))
    return 0


def cmd_compare(argv: Sequence[str]) -> int:
    from .summary import compare_runs, render_compare_markdown

    p = argparse.ArgumentParser(
        prog="evalkit compare",
        description="Compare runs against the first one, per task: paired difference of avg@n and maj@n over "
                    "the problems both runs have, with a bootstrap 95%% interval; a difference whose interval "
                    "excludes 0 is distinguishable from noise.")
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
    args = p.parse_args(argv)
    if len(args.runs) < 2:
        p.error("compare needs at least two run directories")
    from .resolution import apply, audited_error, min_effect, render_verdicts, seed_spread

    spread = seed_spread(args.seed_runs) if args.seed_runs and args.min_effect is None else None
    grader = audited_error([*args.runs, *(args.seed_runs or [])]) if args.min_effect is None else None
    result = compare_runs(args.runs, resamples=args.bootstrap_resamples, seed=args.seed)
    apply(result, min_effect(args.min_effect, spread, grader))
    print(json.dumps(result, indent=2) if args.json else render_compare_markdown(result) + render_verdicts(result))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ", ".join(list(SUITES) + ["run", "list", "report", "compare", "audit", "sweep"])
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: evalkit {" + commands + "} [options]\n\n"
              "Math benchmark evaluation on vLLM with many samples per problem, honest statistics\n"
              "(bootstrap intervals over problems, paired comparisons), per-sample records and resume.\n\n"
              "  evalkit TASK --model PATH [options]   run (TASK: " + ", ".join(SUITES) + ")\n"
              "  evalkit run --data FILE --name NAME   run on any JSONL of problems and answers\n"
              "  evalkit list                          tasks, sources, sizes, answer formats\n"
              "  evalkit report RUN_DIR                summary of a run\n"
              "  evalkit compare RUN_A RUN_B [...]     paired differences against RUN_A\n"
              "  evalkit audit RUN_DIR --n 50          hand-check a stratified sample: the grader's error rate\n"
              "  evalkit sweep RUN_RECORD TASK --output DIR [options]   every checkpoint of a training run\n\n"
              "'evalkit TASK --help' lists the run options.\n\n" + EPILOG)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command in SUITES:
            return cmd_run(command, rest)
        if command == "run":
            return cmd_run(None, rest)
        if command == "list":
            return cmd_list(rest)
        if command == "report":
            return cmd_report(rest)
        if command == "compare":
            return cmd_compare(rest)
        if command == "sweep":
            from .sweep import main as sweep_main

            return sweep_main(rest)
        if command == "audit":
            from .audit import main as audit_main

            return audit_main(rest)
    except (DataError, RunDirError, TemplateError, ValueError) as exc:
        print(f"evalkit: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    print(f"evalkit: unknown command {command!r}; choose from {commands}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
