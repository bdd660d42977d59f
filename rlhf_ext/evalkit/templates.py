"""Prompt templates: how a problem becomes the token ids the model sees.

The template changes scores by tens of points (docs/evalkit.md, "The training run's template":
the same model on GSM8K with and without its chat template), so it is recorded in every run and
must match the one used in training.

* ``r1`` -- the DeepSeek-R1 usage recommendation (DeepSeek-R1 model card, "Usage
  Recommendations"): the model's own chat template, no system prompt, and the instruction
  "Please reason step by step, and put your final answer within \\boxed{}." in the user turn.
* ``qwen25-math-cot`` -- the Qwen2.5-Math evaluation prompt (QwenLM/Qwen2.5-Math, evaluation
  ``qwen25-math-cot``): ChatML written out literally, the same instruction as the system prompt.
* ``chat`` -- the model's chat template with the bare problem as the user turn.
* ``none`` -- the bare problem text, for base models.
* ``r1-zero`` -- the R1-Zero prompt of Dr.GRPO (Liu et al. 2025, arXiv 2503.20783, their "R1
  template"), plain text without a chat template, reasoning in ``<think>`` and the answer in
  ``<answer>`` tags; byte for byte the ``--data.input_template`` of examples/suites/eight_algorithms.toml.
* ``file`` -- a user template read from a file (``--template-file``): plain text with one ``{}``
  where the problem goes, no chat template, exactly as OpenRLHF's ``--data.input_template``.

:func:`training_prompt_form` and :func:`evaluation_prompt_form` reduce a training run's flags and an
evaluation's template to one comparable form, and :func:`template_mismatch` says how they differ.

Chat-template prompts are rendered to text first and tokenized without adding special tokens,
because chat templates already spell out BOS; letting the tokenizer add another would silently
double it (the well-known double-BOS pitfall of feeding rendered chats to ``generate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
R1_ZERO_TEMPLATE = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The "
    "Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. "
    "The reasoning process is enclosed within <think> </think> and answer is enclosed within <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\n"
    "User: {}\nAssistant: <think>"
)
TEMPLATES = ("r1", "qwen25-math-cot", "chat", "none", "r1-zero", "file")
DEFAULT_TEMPLATE = "r1"


class TemplateError(ValueError):
    """A template cannot be applied with this tokenizer or these options."""


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    token_ids: tuple[int, ...]


def check_template_text(text: Optional[str]) -> str:
    """A user template must hold exactly one ``{}`` (OpenRLHF's ``--data.input_template`` form)."""
    if not isinstance(text, str) or text.count("{}") != 1:
        raise TemplateError("a template file must contain exactly one '{}' where the problem goes "
                            "(the form of OpenRLHF's --data.input_template)")
    return text


def render_prompt(problem: str, template: str, tokenizer, system_prompt: Optional[str] = None,
                  template_text: Optional[str] = None) -> RenderedPrompt:
    """Turn one problem into prompt text and token ids with ``tokenizer`` (a Hugging Face tokenizer);
    ``template_text`` is the text of ``template="file"``."""
    if template not in TEMPLATES:
        raise TemplateError(f"unknown template {template!r}; choose from {', '.join(TEMPLATES)}")
    if template in ("r1-zero", "file"):
        if system_prompt:
            raise TemplateError(f"--system-prompt needs a chat template, not --template {template}")
        form = R1_ZERO_TEMPLATE if template == "r1-zero" else check_template_text(template_text)
        text = form.replace("{}", problem, 1)
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]  # as OpenRLHF tokenizes a templated prompt
        if not ids:
            raise TemplateError("the rendered prompt tokenizes to nothing")
        return RenderedPrompt(text=text, token_ids=tuple(int(i) for i in ids))
    if template in ("r1", "chat"):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(f"template {template!r} needs the model's chat template, and this tokenizer "
                                "has none; use --template qwen25-math-cot or --template none")
        messages = []
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        user = f"{problem}\n{BOXED_INSTRUCTION}" if template == "r1" else problem
        messages.append({"role": "user", "content": user})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    elif template == "qwen25-math-cot":
        system = system_prompt if system_prompt else BOXED_INSTRUCTION
        text = (f"<|im_start|>system\n{system}<|im_end|>\n"
                f"<|im_start|>user\n{problem}<|im_end|>\n"
                f"<|im_start|>assistant\n")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        if system_prompt:
            raise TemplateError("--system-prompt needs a chat template (r1, qwen25-math-cot or chat), "
                                "not --template none")
        text = problem
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    if not ids:
        raise TemplateError("the rendered prompt tokenizes to nothing")
    return RenderedPrompt(text=text, token_ids=tuple(int(i) for i in ids))


PromptForm = tuple
"""``("chat", user turn form, system prompt)`` or ``("text", form, None)``; forms use ``{}`` for the problem."""


def training_prompt_form(args) -> Optional[PromptForm]:
    """The prompt form of an OpenRLHF run from its recorded flags (``config.json`` ``args``):
    ``--data.apply_chat_template`` puts the data's text as the user turn of the chat template (and
    OpenRLHF then ignores ``--data.input_template``); otherwise ``--data.input_template`` (default:
    the bare text). None when the record does not say (e.g. a run imported from TensorBoard)."""
    if "data.apply_chat_template" not in args and "data.input_template" not in args:
        return None
    if args.get("data.apply_chat_template"):
        return ("chat", "{}", None)
    return ("text", args.get("data.input_template") or "{}", None)


def evaluation_prompt_form(generation: dict) -> Optional[PromptForm]:
    """The prompt form of an evalkit run from its ``config.json`` ``generation``."""
    template, system = generation.get("template"), generation.get("system_prompt")
    if template == "chat":
        return ("chat", "{}", system)
    if template == "r1":
        return ("chat", "{}\n" + BOXED_INSTRUCTION, system)
    if template == "qwen25-math-cot":
        return ("text", f"<|im_start|>system\n{system or BOXED_INSTRUCTION}<|im_end|>\n<|im_start|>user\n{{}}"
                        "<|im_end|>\n<|im_start|>assistant\n", None)
    if template == "none":
        return ("text", "{}", None)
    if template == "r1-zero":
        return ("text", R1_ZERO_TEMPLATE, None)
    if template == "file":
        return ("text", generation.get("template_text") or "", None)
    return None


def template_mismatch(args, generation: dict) -> Optional[str]:
    """A sentence saying how an evaluation's prompt differs from the one the run trained with, or None
    when they are the same (or either is unknown)."""
    train, ev = training_prompt_form(args), evaluation_prompt_form(generation)
    if train is None or ev is None or train == ev:
        return None

    def say(form):
        kind, text, system = form
        head = "the chat template with the user turn " if kind == "chat" else "plain text "
        return head + repr(text[:80] + ("..." if len(text) > 80 else "")) + (f" and system prompt {system!r}" if system else "")

    return (f"the evaluation's prompt template ({generation.get('template')}: {say(ev)}) differs from the one "
            f"the run trained with ({say(train)}); mismatched templates cost tens of points")
