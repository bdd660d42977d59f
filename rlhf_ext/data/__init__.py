"""Data tools between RL stages, on evalkit's engine: sample, filter, pairs, sft, clean.

=====================  ==============================================================
module                 idea
=====================  ==============================================================
:mod:`.sample`         N graded samples per prompt (an evalkit run over a custom task)
:mod:`.sampled`        read a sample directory back as one group per prompt
:mod:`.ranges`         ``--keep "0<acc<1"`` pass-rate ranges
:mod:`.filter`         prompts to train on next (OpenRLHF prompt format)
:mod:`.pairs`          DPO pairs (OpenRLHF / TRL preference format)
:mod:`.sft`            rejection-sampling SFT sets (OpenRLHF SFT format)
:mod:`.clean`          rule filters, exact and near duplicates (MinHash)
:mod:`.decontaminate`  n-gram overlap with benchmark problems
:mod:`.rules`          text normalisation, URL/boilerplate and script-share rules
:mod:`.io`             JSONL reading and never-overwrite writing
=====================  ==============================================================

Command line: ``rlhf-ext data COMMAND --help``; walk-through: docs/data.md.
"""

from .filter import filter_prompts
from .io import DataToolError, read_jsonl, write_jsonl
from .pairs import build_pairs, pairs_for_group
from .ranges import AccRange, parse_acc_range
from .sample_dirs import PromptGroup, SampledRun, load_sample_dir, pass_rate_histogram
from .sft import build_sft

__all__ = [
    "AccRange",
    "DataToolError",
    "PromptGroup",
    "SampledRun",
    "build_pairs",
    "build_sft",
    "filter_prompts",
    "load_sample_dir",
    "pairs_for_group",
    "parse_acc_range",
    "pass_rate_histogram",
    "read_jsonl",
    "write_jsonl",
]
