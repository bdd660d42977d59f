"""Does a run fit the model's context? Answered from the model's config before any engine starts.

An engine start costs seconds on a GPU and half a minute on a CPU; a run whose longest prompt plus
``--max-tokens`` exceeds the context is refused before that, from the prompts already tokenized
with the run's tokenizer and chat template and the context read from the model's configuration,
the way vLLM derives it (``_get_and_verify_max_len`` in vllm/config/model.py and
``derive_max_model_len_and_key`` in vllm/transformers_utils/model_arch_config_convertor.py, vLLM
0.32; re-implemented here, not imported, so that vLLM stays unloaded):

- the smallest of the length keys of the text config (``max_position_embeddings``, ``n_positions``,
  ...; a ``model_max_length`` in the config wins, as for Command-R); ``tokenizer_config.json`` does
  not count (vLLM reads it for pooling models only);
- times the RoPE scaling ``factor`` for the scaling types that do not already count it in
  ``max_position_embeddings`` (not for YaRN, llama3, longrope);
- 2048 when the config names no length at all (vLLM's default);
- ``--max-model-len`` may lower it, never raise it (vLLM refuses that).

The refusal names only fixes that exist: a smaller ``--max-tokens`` only when the longest prompt
leaves room, a larger ``--max-model-len`` only up to what the model allows, otherwise a model with
a longer context or a data file without the long problems (``evalkit run --data``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

# vLLM's order; the smallest value present wins
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# RoPE types whose max_position_embeddings already is the scaled length
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
DEFAULT_CONTEXT = 2048


@dataclass(frozen=True)
class ModelContext:
    """The context a run gets (``limit``) and the most the model allows (``model_max``)."""

    limit: int
    model_max: int
    source: str  # where model_max comes from, for the message
    fixed: bool = False  # an engine already loaded: --max-model-len cannot change it


def _rope_factor(config) -> float:
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or not params:
        params = getattr(config, "rope_scaling", None)
    if not isinstance(params, dict) or not params:
        return 1.0
    # per layer type ({"full_attention": {...}, ...}) or one dict
    layers = [p for p in params.values() if isinstance(p, dict) and p] or [params]
    factor = 1.0
    for p in layers:
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in _PRESCALED_ROPE and p.get("factor") is not None:
            factor = float(p["factor"])
    return factor


def model_context(model: str, max_model_len: Optional[int] = None, trust_remote_code: bool = False) -> ModelContext:
    """The context vLLM would give ``model`` under ``--max-model-len`` (see the module docstring)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ValueError(f"could not read the configuration of --model {model}: {exc}") from exc
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = {k: getattr(text, k) for k in LENGTH_KEYS if isinstance(getattr(text, k, None), (int, float))}
    key = "model_max_length" if found.get("model_max_length") else (min(found, key=found.get) if found else None)
    derived, source = (float(found[key]), f"{key}={int(found[key])} in its config.json") if key else (float("inf"), "")
    if derived == float("inf"):
        if max_model_len:
            return ModelContext(max_model_len, max_model_len, "--max-model-len (the config names no length)")
        derived, source = float(DEFAULT_CONTEXT), f"vLLM's default of {DEFAULT_CONTEXT}: the config names no length"
    factor = _rope_factor(text)
    if factor != 1.0:
        source += f", times its RoPE scaling factor {factor:g}"
        derived *= factor
    model_max = int(derived)
    long_allowed = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").lower() in ("1", "true")
    if max_model_len and max_model_len > model_max and long_allowed:
        # vLLM's escape hatch (at the user's risk): the engine will take the longer length
        return ModelContext(max_model_len, max_model_len, source + ", overridden by VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    if max_model_len and max_model_len > model_max:
        raise ValueError(f"--max-model-len {max_model_len} exceeds the context of --model {model}: {model_max} "
                         f"tokens ({source}); vLLM would refuse it. Leave --max-model-len out to use the "
                         "model's whole context")
    return ModelContext(max_model_len or model_max, model_max, source)


def context_refusal(lengths: Sequence[int], max_tokens: int, ctx: ModelContext) -> Optional[str]:
    """Why the prompts of ``lengths`` (tokens) with ``max_tokens`` do not fit ``ctx``, with the fixes
    that exist; None when they fit."""
    longest = max(lengths)
    if longest + max_tokens <= ctx.limit:
        return None
    over = sum(1 for n in lengths if n + max_tokens > ctx.limit)
    fixes = []
    room = ctx.limit - longest
    if room >= 1:
        fixes.append(f"--max-tokens {room} (longer responses are then cut at {room} tokens)")
    if not ctx.fixed and ctx.limit < ctx.model_max:
        if longest + max_tokens <= ctx.model_max:
            fixes.append(f"--max-model-len {longest + max_tokens} (or leave it out: the model allows "
                         f"{ctx.model_max})")
        elif ctx.model_max - longest >= 1:
            fixes.append(f"--max-model-len {ctx.model_max} --max-tokens {ctx.model_max - longest}")
    fixes.append(f"a model whose context holds at least {longest + max_tokens} tokens")
    if over < len(lengths):
        fixes.append(f"leave out the {over} problem(s) that do not fit: 'evalkit run --data FILE' on a JSONL "
                     "without them (a different benchmark then, report it as such)")
    context = "the engine's context" if ctx.fixed else "the context"
    where = f" ({ctx.source})" if ctx.source else ""
    lead = (f"the longest prompt ({longest} tokens) alone exceeds {context} of {ctx.limit} tokens{where}"
            if room < 1 else
            f"the longest prompt ({longest} tokens) plus --max-tokens {max_tokens} exceeds {context} of "
            f"{ctx.limit} tokens{where}")
    when = "Refused" if ctx.fixed else "Refused before starting the engine"
    return (f"{lead}; {over} of {len(lengths)} problems do not fit with --max-tokens {max_tokens}. {when}, so "
            "that no response is cut short by the context instead of by --max-tokens. Fixes: " + "; or ".join(fixes))


def check_prompts_fit(model: str, lengths: Sequence[int], max_tokens: int, max_model_len: Optional[int] = None,
                      trust_remote_code: bool = False) -> None:
    """Raise ``ValueError`` when the prompts (token counts) and ``max_tokens`` exceed the model's context."""
    if not lengths:
        return
    message = context_refusal(lengths, max_tokens, model_context(model, max_model_len, trust_remote_code))
    if message:
        raise ValueError(message)
