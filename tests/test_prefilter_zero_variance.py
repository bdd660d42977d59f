"""Zero-variance prompt groups counted before OpenRLHF's dynamic filtering drops them (patches/openrlhf/prefilter)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.patches.openrlhf import prefilter
from rlhf_ext.patches.openrlhf import run_record as rr


def test_group_metrics_hand_computed():
    # groups of 4: [1,1,1,1] all equal, [0,1,0,0] mixed, [0,0,0,0] all equal; the 2 trailing values are no group
    values = [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1]
    assert prefilter.group_metrics(values, 4) == {prefilter.BEFORE_FILTER_KEY: pytest.approx(2 / 3),
                                                   prefilter.GROUPS_KEY: 3.0}
    assert prefilter.group_metrics([1, None, 1, 1], 4)[prefilter.BEFORE_FILTER_KEY] == 0.0  # missing: not equal
    assert prefilter.group_metrics([1, 1], 1) == {} and prefilter.group_metrics([1, 1, 1], 4) == {}


class Generator:
    """Stands in for OpenRLHF's SamplesGenerator around the two patched methods: one call of
    ``_process_response_into_experience`` per response, a prompt's responses one after another,
    then DAPO-style dynamic filtering of the group by its mean score (as samples_generator.py does)."""

    def __init__(self, groups, filtering):
        self.groups, self.filtering = groups, filtering
        self.args = SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=len(groups[0])),
                                    rlhf_ext=SimpleNamespace(step_metrics="all"))

    def _process(self, response, **kw):
        return SimpleNamespace(rewards=torch.tensor([response]), scores=torch.tensor([response]))

    def _generate(self, dataloader_iter, num_prompts, dynamic_filtering, **kw):
        kept = []
        for group in self.groups:
            experiences = [type(self).process(self, r, **kw) for r in group]
            mean = sum(float(e.scores[0]) for e in experiences) / len(experiences)
            if dynamic_filtering and not 0 < mean < 1:
                continue
            kept.extend(experiences)
        return kept, len(self.groups), False


Generator.process = prefilter.make_process_response_into_experience(Generator._process)
Generator.generate = prefilter.make_generate_vllm(Generator._generate)


@pytest.fixture()
def pending():
    rr._take_pending()
    yield
    rr._take_pending()


def test_counted_before_the_filter_and_added_to_the_step(pending):
    groups = [[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0]]
    gen = Generator(groups, filtering=True)
    kept, consumed, _ = gen.generate(iter(()), 4, True)
    assert len(kept) == 8 and consumed == 4  # the two all-equal groups were dropped
    # after the filter every kept group has variance; before it, half the groups had none
    assert rr._take_pending() == {prefilter.BEFORE_FILTER_KEY: 0.5, prefilter.GROUPS_KEY: 4.0}
    assert "_rlhf_ext_group_values" not in gen.__dict__
    gen.args.rlhf_ext.step_metrics = "off"
    gen.generate(iter(()), 4, True)
    assert rr._take_pending() == {}


def test_the_seams_are_registered_on_openrlhfs_samples_generator():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    try:
        from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

        for name in ("_generate_vllm", "_process_response_into_experience"):
            method = getattr(SamplesGenerator, name)
            assert method.__code__.co_filename == prefilter.__file__, name
            assert hasattr(method, "__wrapped__")
    finally:
        deactivate()
