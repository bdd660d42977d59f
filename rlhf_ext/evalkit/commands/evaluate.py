"""``evalkit TASK --model PATH [options]``: evaluate a model on a built-in task (``evalkit run``, the
custom task, shares these options: :mod:`.custom`). The flags become :class:`~rlhf_ext.evalkit.options.RunOptions`
(with ``--resume``, those not given are read from the run's ``config.json``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from .. import records
from ..options import RunOptions
from ..records import RunDirError, read_json
from ..templates import BOXED_INSTRUCTION, TEMPLATES
from . import EPILOG

# Options a resumed run may take from its config.json when they are not given again.
_RESUMABLE = ("model", "n_samples", "temperature", "top_p", "top_k", "min_p", "max_tokens", "template",
              "system_prompt", "seed", "tp", "dp", "limit", "gpu_memory_utilization", "kv_cache", "enforce_eager",
              "max_model_len", "dtype", "shuffle_options")
_DEFAULTS = {"n_samples": 64, "temperature": 0.6, "top_p": 0.95, "top_k": -1, "min_p": 0.0, "max_tokens": 32768,
             "template": "r1",
             "seed": 0, "tp": 1, "dp": 1, "dtype": "auto"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The run options of ``evalkit TASK`` (and ``evalkit run``)."""
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
    g = p.add_argument_group("verifier cascade (an LLM judges the answers the rules score wrong)")
    g.add_argument("--verifier-url", metavar="URL",
                   help="OpenAI-compatible server of the verifier, e.g. http://localhost:8001 (a vLLM server: "
                        "python -m vllm.entrypoints.openai.api_server); bearer token from $OPENAI_API_KEY if set")
    g.add_argument("--verifier-model", metavar="NAME", help="the model name the verifier server serves")
    g.add_argument("--verifier-timeout", type=float, default=30.0,
                   help="seconds per verifier request (default 30; on timeout the rule verdict stands)")
    g.add_argument("--verifier-concurrency", type=int, default=8, help="verifier requests in flight (default 8)")
    g.add_argument("--verifier-max-tokens", type=int, default=16,
                   help="tokens of the verifier's reply (default 16; more for a reasoning verifier)")
    g.add_argument("--verifier-vllm-choice", action="store_true",
                   help="a vLLM verifier server: constrain its reply to CORRECT/INCORRECT (structured outputs)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--verbose", action="store_true", help="keep vLLM's INFO logging")


def parser(task: str, description: str = "") -> argparse.ArgumentParser:
    """``evalkit TASK``'s parser on its own (as the command line builds it)."""
    p = argparse.ArgumentParser(prog=f"evalkit {task}", description=description, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def run_options(suite: Optional[str], args: argparse.Namespace, custom: Optional[dict] = None):
    """Run options from the flags (and, with --resume, the run's config.json).

    ``custom``: the flags of a custom task (``evalkit run``); ``suite`` is then its name, or None
    to take it from the resumed run.
    """
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
                      bootstrap_resamples=args.bootstrap_resamples, verifier_url=args.verifier_url,
                      verifier_model=args.verifier_model, verifier_timeout=args.verifier_timeout,
                      verifier_concurrency=args.verifier_concurrency, verifier_max_tokens=args.verifier_max_tokens,
                      verifier_vllm_choice=args.verifier_vllm_choice,
                      progress=not args.no_progress, custom_task=custom, **values)


def evaluate(suite: Optional[str], args: argparse.Namespace, custom: Optional[dict] = None) -> int:
    """Run the evaluation ``args`` ask for (``custom``: the custom task of ``evalkit run``); print its summary."""
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from ..runner import EvalInterrupted, run_eval

    options = run_options(suite, args, custom)
    try:
        output, summary = run_eval(options, log=lambda m: print(m, file=sys.stderr, flush=True))
    except EvalInterrupted as exc:
        print(f"evalkit: {exc}", file=sys.stderr)
        return 130
    print((output / records.SUMMARY_MD).read_text(encoding="utf-8"))
    print(f"run directory: {output}")
    return 0


def run(args: argparse.Namespace) -> int:
    return evaluate(args.suite, args)
