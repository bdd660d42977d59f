"""The prompts of a run: each problem (or, with shuffled options, each sample) rendered with the
run's template and the model's tokenizer, on demand."""

from __future__ import annotations

from .options import RunOptions
from .prepare import PreparedRun
from .seeds import option_permutation
from .tasks import Problem
from .templates import render_prompt


def load_tokenizer(options: RunOptions):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(options.model, trust_remote_code=options.trust_remote_code)
    except Exception as exc:
        raise ValueError(f"could not load the tokenizer of --model {options.model}: {exc}") from exc


def sample_view(options: RunOptions, problem: Problem, sample_index: int):
    """``(problem text, gold, shown label -> original label or None)`` as sample ``sample_index`` sees them."""
    if options.shuffle_options is None or problem.answer_type == "math":
        return problem.text, problem.gold, None
    from rlhf_ext.rewards.choice import parse_structured_gold, render_options, shuffled_gold

    gold = parse_structured_gold(problem.gold)
    if not any(gold.options.texts):
        raise ValueError(f"--shuffle-options: problem {problem.id} of {problem.task} gives no option texts (a "
                         "ranking whose options are only its answer's labels): its question names the options, "
                         "so re-lettering them would change the question; run this task without --shuffle-options")
    perm = option_permutation(options.shuffle_options, problem.task, problem.id, sample_index,
                              len(gold.options.labels))
    shown, mapping = shuffled_gold(gold, perm)
    return render_options(problem.question, shown.options), shown, mapping


def prompt_key(options: RunOptions, problem: Problem, sample_index: int) -> tuple:
    """Where a sample's prompt is kept in ``PreparedRun.prompts``: per problem, or per sample when shuffled."""
    if options.shuffle_options is None or problem.answer_type == "math":
        return (problem.task, problem.id)
    return (problem.task, problem.id, sample_index)


def render_prompts(run: PreparedRun, keys=None) -> None:
    """Render the prompts of ``keys`` ((task, problem id) pairs, or (task, problem id, sample index)
    with shuffled options; default every problem) into ``run.prompts``.

    Loading the tokenizer costs seconds (it imports torch), so a rerun with nothing left to
    generate never does it.
    """
    o = run.options
    if keys is None:
        keys = {prompt_key(o, p, i) for td in run.tasks for p in td.problems for i in range(o.n_samples)}
    wanted = set(keys) - set(run.prompts)
    if not wanted:
        return
    tokenizer = load_tokenizer(run.options)
    problems = {(p.task, p.id): p for td in run.tasks for p in td.problems}
    for key in sorted(wanted, key=str):
        p = problems[key[:2]]
        text = p.text if len(key) == 2 else sample_view(o, p, key[2])[0]
        rendered = render_prompt(text, o.template, tokenizer, o.system_prompt, o.template_text)
        run.prompts[key] = (rendered.text, rendered.token_ids)
