"""rlhf_ext's FLOPs count (PaLM's 6N + 12LHQT) against verl 0.9.1's own estimate for Qwen2
(``verl.utils.flops_counter._estimate_qwen2_flops``, what its ``FlopsCounter`` calls for Qwen2; the
counter itself asks CUDA for the device's peak at construction, so the estimate is called directly), which counts two things differently, both derived here:

* verl adds the input embedding to N (``emd_and_lm_head_N = 2 V d``); rlhf_ext counts only the
  output head, the embedding being a lookup, not a multiply: verl is higher by 6 V d per token;
* verl halves the attention term for the causal mask (6 L H Q T^2 per sequence); PaLM, and rlhf_ext
  with it, do not (12 L H Q T^2): verl is lower by 6 L H Q T^2.
"""

from __future__ import annotations

import pytest
from transformers import Qwen2Config

from rlhf_ext.runs.flops import shape_from_config


@pytest.mark.parametrize("seqlens", [[10], [7, 13, 21]])
def test_qwen2_flops_equal_verl_up_to_the_two_documented_terms(seqlens):
    from verl.utils.flops_counter import _estimate_qwen2_flops

    config = Qwen2Config(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=500)
    shape = shape_from_config(config.to_dict())
    # verl reports TFLOP/s: with delta_time 1e-12 s it is the FLOP count itself
    verl_flops = _estimate_qwen2_flops(config, sum(seqlens), seqlens, 1e-12)
    ours = sum(t * shape.train_flops_per_token(t) for t in seqlens)
    tokens, squares = sum(seqlens), sum(t * t for t in seqlens)
    L, H, Q, V, d = shape.layers, shape.heads, shape.head_dim, shape.vocab, shape.hidden
    assert verl_flops == pytest.approx(ours + 6 * V * d * tokens - 6 * L * H * Q * squares, rel=1e-9)
