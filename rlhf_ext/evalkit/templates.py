"""Prompt templates: how a problem becomes the token ids the model sees.

The template changes scores by tens of points (../shared/REFERENCE.md section 5), so it is
recorded in every run and must match the one used in training.

* ``r1`` -- the DeepSeek-R1 usage recommendation (DeepSeek-R1 model card, "Usage
  Recommendations"): the model's own chat template, no system prompt, and the instruction
  "Please reason step by step, and put your final answer within \\boxed{}." in the user turn.
* ``qwen25-math-cot`` -- the Qwen2.5-Math evaluation prompt (QwenLM/Qwen2.5-Math, evaluation
  ``qwen25-math-cot``): ChatML written out literally, the same instruction as the system prompt.
* ``chat`` -- the model's chat template with the bare problem as the user turn.
* ``none`` -- the bare problem text, for base models.

Chat-template prompts are rendered to text first and tokenized without adding special tokens,
because chat templates already spell out BOS; letting the tokenizer add another would silently
double it (the well-known double-BOS pitfall of feeding rendered chats to ``generate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TEMPLATES = ("r1", "qwen25-math-cot", "chat", "none")
DEFAULT_TEMPLATE = "r1"


class TemplateError(ValueError):
    """A template cannot be applied with this tokenizer or these options."""


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    token_ids: tuple[int, ...]


def render_prompt(problem: str, template: str, tokenizer, system_prompt: Optional[str] = None) -> RenderedPrompt:
    """Turn one problem into prompt text and token ids with ``tokenizer`` (a Hugging Face tokenizer)."""
    if template not in TEMPLATES:
        raise TemplateError(f"unknown template {template!r}; choose from {', '.join(TEMPLATES)}")
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
