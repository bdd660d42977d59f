"""``rlhf-ext data COMMAND``: sample, filter, pairs, sft, clean. Every command reads and writes JSONL,
prints what it did in numbers and refuses to overwrite its output (``--force`` allows it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..ground.argtypes import positive_int as _positive
from ..ground.argtypes import probability as _probability
from ..ground.subcommands import run_subcommand, set_subcommand_handler
from .io import DataToolError


def _parser(subparsers, name, help_text, description, example):
    return subparsers.add_parser(name, help=help_text, description=description,
                                 epilog="example:\n  " + example,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def _output_args(p, what: str) -> None:
    p.add_argument("--output", "-o", type=Path, required=True, help=f"{what} (JSONL; must not exist)")
    p.add_argument("--force", action="store_true", help="overwrite --output if it exists")


def add_data_commands(subparsers) -> None:
    # --- sample
    p = _parser(subparsers, "sample", "N graded samples per prompt (vLLM, resumable) and a per-prompt table",
                "Sample every prompt of a JSONL N times with vLLM and grade each answer with rlhf_ext's "
                "MathGrader (evalkit's engine: --tp/--dp, per-sample records, resume). DIR is an evalkit run "
                "directory plus prompts.jsonl (pass rate, response lengths, truncation per prompt). Rerunning "
                "the same command generates only missing samples; other parameters into the same DIR are "
                "refused.",
                "rlhf-ext data sample --model ckpt/step_100 --data train.jsonl --problem-key prompt "
                "--answer-key label --n-samples 8 --output runs/sample_step100")
    p.add_argument("--model", required=True, help="model directory or Hugging Face id")
    p.add_argument("--data", required=True, type=Path, help="JSONL of prompts with gold answers")
    p.add_argument("--output", "-o", type=Path, required=True, help="sample directory (new, or the same run to resume)")
    p.add_argument("--name", help="task name in the records (default: the data file's stem)")
    p.add_argument("--problem-key", help="field with the prompt text (default: problem, question or Problem)")
    p.add_argument("--answer-key", help="field with the gold answer (default: answer or Answer)")
    p.add_argument("--answer-type", choices=("math", "choice", "ranking"), default=None,
                   help="math (default); choice / ranking: rows hold 'options' and 'answer' (a label, or the "
                        "labels in order), as 'evalkit run --answer-type' reads them (docs/evalkit.md)")
    p.add_argument("--id-key", help="field with a unique id (default: id, unique_id, idx or ID; else the line number)")
    p.add_argument("--n-samples", type=_positive, default=8, help="samples per prompt (default 8)")
    p.add_argument("--template", default="chat", choices=("chat", "r1", "qwen25-math-cot", "none", "r1-zero"),
                   help="prompt template (default chat: the bare prompt in the model's chat template, as "
                        "OpenRLHF's --data.apply_chat_template renders it)")
    p.add_argument("--system-prompt", help="system prompt (chat templates only)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="top_p (default 1.0)")
    p.add_argument("--top-k", type=int, default=-1, help="top_k; -1: off (default -1, as OpenRLHF's --rollout.top_k)")
    p.add_argument("--min-p", type=float, default=0.0, help="min_p; 0: off (default 0)")
    p.add_argument("--max-tokens", type=_positive, default=1024, help="max new tokens per sample (default 1024)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument("--limit", type=_positive, help="only the first N prompts")
    p.add_argument("--tp", type=_positive, default=1, help="tensor parallel size per engine (default 1)")
    p.add_argument("--dp", type=_positive, default=1, help="data parallel engines as Ray actors (default 1)")
    p.add_argument("--ray-address", help="existing Ray cluster for --dp")
    p.add_argument("--gpu-memory-utilization", type=float, help="vLLM memory fraction (default: vLLM's)")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="disable graph capture (default: on for CPU only)")
    p.add_argument("--max-model-len", type=_positive, help="override the model's context length")
    p.add_argument("--grader-workers", type=_positive, help="grading processes (default min(CPUs, 8))")
    p.add_argument("--require-anchor", action=argparse.BooleanOptionalAction, default=None,
                   help="grade only answers stated with an anchor (\\boxed{}, 'the answer is', <answer>, ####), as "
                        "the training reward does; default off (as evalkit): a response without one is graded on "
                        "its last math expression. A resumed directory keeps its own setting")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    set_subcommand_handler(p, _run_sample)

    # --- filter
    p = _parser(subparsers, "filter", "prompts whose pass rate is in a range, in OpenRLHF's prompt format",
                "Keep the prompts of a sample directory whose pass rate is in --keep (e.g. '0<acc<1': drop what "
                "the model always or never solves), optionally those with at most --max-truncated of their "
                "samples cut off, and write them as OpenRLHF prompts: {INPUT_KEY: prompt, LABEL_KEY: gold}. "
                "Prints the pass-rate histogram and the counts kept/dropped.",
                "rlhf-ext data filter runs/sample_step100 --keep '0<acc<1' --output next_prompts.jsonl\n"
                "  then: train_ppo_ray --data.prompt_dataset next_prompts.jsonl --data.input_key prompt "
                "--data.label_key label --data.apply_chat_template ...")
    p.add_argument("sample_dir", type=Path, help="directory written by 'data sample'")
    p.add_argument("--keep", default="0<acc<1", help="pass-rate range to keep (default '0<acc<1'; e.g. "
                                                     "'acc<1', '0.1<=acc<=0.8', 'acc==0')")
    p.add_argument("--max-truncated", type=_probability,
                   help="drop prompts with more than this fraction of truncated samples")
    p.add_argument("--input-key", default="prompt", help="field for the prompt (OpenRLHF --data.input_key; "
                                                        "default prompt)")
    p.add_argument("--label-key", default="label", help="field for the gold answer (--data.label_key; default label)")
    _output_args(p, "prompt file")
    set_subcommand_handler(p, _run_filter)

    # --- pairs
    p = _parser(subparsers, "pairs", "DPO pairs: correct vs wrong, and short vs long when all are correct",
                "Build preference pairs from a sample directory. Prompts with right and wrong answers: (correct, "
                "wrong) pairs, at most --max-pairs-per-prompt, chosen with --seed. Prompts always answered "
                "right: the two shortest correct answers against the two longest (a 2x2 that teaches brevity; "
                "--no-brevity to skip). All-wrong prompts are dropped. Output: prompt/chosen/rejected as chat "
                "messages (OpenRLHF --data.prompt_key prompt --data.apply_chat_template; TRL's conversational "
                "format) or, with --text, plain text with the rendered prompt (TRL's standard format).",
                "rlhf-ext data pairs runs/sample_step100 --output pairs.jsonl\n"
                "  then: python -m openrlhf.cli.train_dpo --plugin rlhf_ext --model.loss_type simpo "
                "--data.dataset pairs.jsonl --data.prompt_key prompt --data.apply_chat_template ...")
    p.add_argument("sample_dir", type=Path, help="directory written by 'data sample'")
    p.add_argument("--max-pairs-per-prompt", type=_positive, default=4, help="cap per prompt (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the pair choice (default 0)")
    p.add_argument("--no-brevity", action="store_true", help="no short-vs-long pairs from all-correct prompts")
    p.add_argument("--text", action="store_true", help="plain text instead of chat messages")
    _output_args(p, "pair file")
    set_subcommand_handler(p, _run_pairs)

    # --- sft
    p = _parser(subparsers, "sft", "rejection-sampling SFT set: the correct answers of the kept prompts",
                "Write the correct, complete, distinct answers of the prompts whose pass rate is in --keep, at "
                "most --max-per-prompt each (shortest first), in OpenRLHF's SFT format: chat messages "
                "(--data.input_key messages --data.apply_chat_template) or, with --text, prompt/response "
                "(--data.input_key prompt --data.output_key response).",
                "rlhf-ext data sft runs/sample_step100 --keep '0<acc<1' --max-per-prompt 2 --output sft.jsonl")
    p.add_argument("sample_dir", type=Path, help="directory written by 'data sample'")
    p.add_argument("--keep", default="acc>0", help="pass-rate range of the prompts used (default 'acc>0')")
    p.add_argument("--max-per-prompt", type=_positive, help="at most this many answers per prompt, shortest first")
    p.add_argument("--text", action="store_true", help="plain prompt/response instead of chat messages")
    _output_args(p, "SFT file")
    set_subcommand_handler(p, _run_sft)

    from .clean import add_clean_command

    add_clean_command(subparsers, _parser, _output_args)


def _run_sample(args) -> int:
    import os

    from rlhf_ext.evalkit.runner import EvalInterrupted

    from .sampling import sample

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        _sample(args, sample)
    except EvalInterrupted as exc:
        print(f"rlhf-ext data sample: {exc}", file=sys.stderr)
        return 130
    return 0


def _sample(args, sample) -> None:
    sample(model=args.model, data=args.data, output=args.output, name=args.name, n_samples=args.n_samples,
           problem_key=args.problem_key, answer_key=args.answer_key, id_key=args.id_key,
           answer_type=args.answer_type, template=args.template,
           system_prompt=args.system_prompt, temperature=args.temperature, top_p=args.top_p,
           top_k=args.top_k, min_p=args.min_p, max_tokens=args.max_tokens, seed=args.seed, tp=args.tp, dp=args.dp, limit=args.limit,
           ray_address=args.ray_address, gpu_memory_utilization=args.gpu_memory_utilization,
           enforce_eager=args.enforce_eager, max_model_len=args.max_model_len, grader_workers=args.grader_workers,
           require_anchor=args.require_anchor, progress=not args.no_progress, log=lambda m: print(m, flush=True))


def _run_filter(args) -> int:
    from .filter import filter_prompts
    from .io import check_output, write_jsonl
    from .ranges import parse_acc_range
    from .sample_dirs import load_sample_dir, pass_rate_histogram

    keep = parse_acc_range(args.keep)
    check_output(args.output, args.force)
    run = load_sample_dir(args.sample_dir)
    rows, counts = filter_prompts(run, keep, max_truncated=args.max_truncated, input_key=args.input_key,
                                  label_key=args.label_key)
    write_jsonl(args.output, rows, force=True)
    print(f"data filter: {len(run.groups)} prompts, {run.n_samples} samples each; pass rates:")
    print("\n".join(pass_rate_histogram(run.groups)))
    print(f"  kept {counts['kept']} with {keep.text}; dropped {counts['dropped_acc']} by pass rate, "
          f"{counts['dropped_truncated']} by truncation, {counts['not_sampled']} not sampled")
    print(f"  wrote {len(rows)} prompts to {args.output} (--data.input_key {args.input_key} "
          f"--data.label_key {args.label_key})")
    return 0


def _run_pairs(args) -> int:
    from .io import check_output, write_jsonl
    from .pairs import build_pairs
    from .sample_dirs import load_sample_dir

    check_output(args.output, args.force)
    run = load_sample_dir(args.sample_dir)
    rows, pair_counts, prompt_counts = build_pairs(run, max_per_prompt=args.max_pairs_per_prompt, seed=args.seed,
                                                   brevity=not args.no_brevity, text=args.text)
    write_jsonl(args.output, rows, force=True)
    print(f"data pairs: {len(run.groups)} prompts -> {len(rows)} pairs in {args.output}")
    for rule in sorted(prompt_counts):
        print(f"  {rule:<24} {prompt_counts[rule]:>6} prompts  {pair_counts.get(rule, 0):>7} pairs")
    print("  format: " + ("plain text (no --data.apply_chat_template)" if args.text
                          else "chat messages (--data.prompt_key prompt --data.apply_chat_template)"))
    return 0


def _run_sft(args) -> int:
    from .io import check_output, write_jsonl
    from .ranges import parse_acc_range
    from .sample_dirs import load_sample_dir
    from .sft import build_sft

    keep = parse_acc_range(args.keep)
    check_output(args.output, args.force)
    run = load_sample_dir(args.sample_dir)
    rows, counts = build_sft(run, keep, max_per_prompt=args.max_per_prompt, text=args.text)
    write_jsonl(args.output, rows, force=True)
    print(f"data sft: {len(run.groups)} prompts; kept {counts['prompts_kept']} with {keep.text} -> "
          f"{counts['examples']} examples in {args.output}")
    print(f"  dropped prompts: {counts['prompts_dropped_acc']} by pass rate, {counts['prompts_without_correct']} "
          f"without a complete correct answer, {counts['prompts_not_sampled']} not sampled; "
          f"{counts['duplicates_or_capped']} correct answers left out (duplicate, truncated or over the cap)")
    print("  format: " + ("--data.input_key prompt --data.output_key response" if args.text
                          else "--data.input_key messages --data.apply_chat_template"))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rlhf-ext data``'s commands (sample, filter, pairs, sft, clean) and their flags."""
    sub = parser.add_subparsers(dest="data_command", metavar="COMMAND")
    sub.required = True
    add_data_commands(sub)


def run(args) -> int:
    from rlhf_ext.evalkit.tasks import DataError

    try:
        return run_subcommand(args)
    except (DataToolError, DataError, ValueError) as exc:
        print(f"rlhf-ext data {args.data_command}: error: {exc}", file=sys.stderr)
        return 2
