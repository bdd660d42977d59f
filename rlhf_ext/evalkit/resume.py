"""Resuming into a run directory: refuse one whose samples were made another way, and list the
samples still missing (with their prompts checked against the stored ones and their seeds)."""

from __future__ import annotations

import json

from . import records
from .generation import SampleRequest
from .prepare import PreparedRun
from .prompts import prompt_key, render_prompts
from .records import RunDirError, generation_mismatch, read_json
from .seeds import option_permutation, problem_seed


def check_existing(run: PreparedRun, existing: list[dict]) -> None:
    cfg_path = run.output / records.CONFIG_FILE
    if not cfg_path.exists():
        if run.options.resume:
            raise RunDirError(f"--resume: {run.output} holds no run (no {records.CONFIG_FILE})")
        if existing:
            raise RunDirError(f"{run.output} has {records.SAMPLES_FILE} but no {records.CONFIG_FILE}; "
                              "it is not an evalkit run directory, choose another --output")
        return
    stored = read_json(cfg_path)
    if stored.get("suite") != run.options.suite:
        raise RunDirError(f"{run.output} holds a {stored.get('suite')!r} run, not {run.options.suite!r}; "
                          "choose another --output")
    # a run written before the option existed was graded with the anchor required
    stored_anchor = stored.get("grading", {}).get("require_anchor", True)
    if existing and stored_anchor != run.options.require_anchor:
        flag = "--require-anchor" if stored_anchor else "--no-require-anchor"
        raise RunDirError(f"{run.output} was graded with require_anchor={stored_anchor}; refusing to mix verdicts "
                          f"graded two ways: resume it with {flag}, or use another --output")
    diffs = generation_mismatch(stored.get("generation", {}), run.generation)
    if diffs:
        raise RunDirError(f"{run.output} was generated with different parameters; refusing to mix samples:\n  "
                          + "\n  ".join(diffs) + "\nUse another --output for these parameters.")


def missing_requests(run: PreparedRun, existing: list[dict]) -> list[SampleRequest]:
    """One request per sample of the run not in ``existing``, prompts rendered as needed.

    A problem's stored prompt must equal the one rendered now: a changed tokenizer or chat
    template would otherwise mix samples of two different prompts under one problem.
    """
    have = {records.sample_key(r) for r in existing}
    n = run.options.n_samples
    missing = [(p, i) for td in run.tasks for p in td.problems for i in range(n) if (p.task, p.id, i) not in have]
    o = run.options
    render_prompts(run, [prompt_key(o, p, i) for p, i in missing])
    # with shuffled options each sample has its own prompt: compare with a stored sample of the same order
    stored = {}
    for r in existing:
        key = (r["task"], str(r["problem_id"]))
        stored[key] = r.get("prompt")
        stored[key + (int(r["sample_index"]),)] = r.get("prompt")
    out = []
    orders: dict = {}
    for p, i in missing:
        key = prompt_key(o, p, i)
        text, token_ids = run.prompts[key]
        if len(key) == 3:  # a stored sample that showed the options in the same order
            if (p.task, p.id) not in orders:
                k = len(json.loads(p.gold)["options"])
                orders[(p.task, p.id)] = [tuple(option_permutation(o.shuffle_options, p.task, p.id, j, k))
                                          for j in range(n)]
            perms = orders[(p.task, p.id)]
            same = [j for j in range(n) if (p.task, p.id, j) in stored and perms[j] == perms[i]]
            earlier = stored[(p.task, p.id, same[0])] if same else None
        else:
            earlier = stored.get(key)
        if earlier is not None and earlier != text:
            raise RunDirError(f"{run.output}: the stored prompt of {p.task} problem {p.id} differs from the one "
                              "rendered now (tokenizer or chat template changed); refusing to mix samples")
        out.append(SampleRequest(task=p.task, problem_id=p.id, sample_index=i, token_ids=token_ids,
                                 seed=problem_seed(o.seed, p.task, p.id) + i))
    return out
