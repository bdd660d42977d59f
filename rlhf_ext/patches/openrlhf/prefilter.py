"""The share of zero-variance prompt groups *before* OpenRLHF's dynamic filtering drops them.

``train/zero_variance_group_frac`` (:mod:`.advantages`) is measured on the batch the advantages
are computed for. With ``--algo.dynamic_filtering_enable`` OpenRLHF has already dropped every group
whose mean score falls outside ``--algo.dynamic_filtering_range`` (with 0/1 scores and the range
(0, 1): exactly the all-wrong and all-right groups), so that number reads about 0 and hides how
many groups carried no signal. This module measures the same share where the groups are made:

* ``SamplesGenerator._process_response_into_experience`` (one call per sampled response; OpenRLHF
  calls it for the ``n_samples_per_prompt`` responses of one prompt one after another, from one
  ``ray.get`` of that prompt's request) appends the response's reward (else its score) to a list
  kept on the generator while a ``_generate_vllm`` call runs;
* ``SamplesGenerator._generate_vllm`` cuts that list into groups of ``n`` consecutive values and
  adds ``rlhf_ext/zero_variance_group_frac_before_filter`` (groups whose values are all equal, over
  all groups generated, replacements of filtered prompts included) and ``rlhf_ext/groups_generated``
  to the run record's line of the step about to be trained (:func:`.run_record.add_metrics`).

Without dynamic filtering the value equals ``train/zero_variance_group_frac`` (same groups, same
rewards). Both run in the PPOTrainer actor; with ``--rlhf_ext.step_metrics off`` nothing is recorded.
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Sequence

from .config import setting, step_metrics

_SINK = "_rlhf_ext_group_values"
BEFORE_FILTER_KEY = "rlhf_ext/zero_variance_group_frac_before_filter"
GROUPS_KEY = "rlhf_ext/groups_generated"


def group_metrics(values: Sequence[Optional[float]], n: int) -> Dict[str, float]:
    """Zero-variance share over the complete groups of ``n`` consecutive values (a group with a
    missing value counts as not zero-variance); empty when ``n < 2`` or no group is complete."""
    if n < 2:
        return {}
    groups = [values[i:i + n] for i in range(0, len(values) - len(values) % n, n)]
    if not groups:
        return {}
    zero = sum(1 for g in groups if None not in g and max(g) == min(g))
    return {BEFORE_FILTER_KEY: zero / len(groups), GROUPS_KEY: float(len(groups))}


def _value(experience) -> Optional[float]:
    for field in ("rewards", "scores"):
        t = getattr(experience, field, None)
        if t is not None:
            try:
                return float(t.reshape(-1)[0].item())
            except (AttributeError, IndexError, RuntimeError, ValueError):
                return None
    return None


def make_process_response_into_experience(original, module=None):
    @functools.wraps(original)
    def _process_response_into_experience(self, response, **generate_kwargs):
        experience = original(self, response, **generate_kwargs)
        sink: Optional[List] = self.__dict__.get(_SINK)
        if sink is not None:
            sink.append(_value(experience))
        return experience

    return _process_response_into_experience


def make_generate_vllm(original, module=None):
    @functools.wraps(original)
    def _generate_vllm(self, dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs):
        if not step_metrics(self.args):
            return original(self, dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        self.__dict__[_SINK] = []
        try:
            out = original(self, dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        finally:
            values = self.__dict__.pop(_SINK, [])
        n = int(generate_kwargs.get("n_samples_per_prompt") or setting(self.args, "rollout.n_samples_per_prompt", 1))
        metrics = group_metrics(values, n)
        if metrics:
            from .run_record import add_metrics

            add_metrics(metrics)
        return out

    return _generate_vllm
