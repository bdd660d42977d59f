"""Helpers for the MindSpeed-RL tests: a small transfer dock and the Python processes they start."""

import os
import subprocess
import sys

import ray
import torch


@ray.remote
class StandInTransferDock:
    """The part of MindSpeed-RL's TransferDock that ``compute_advantage`` talks to.

    Holds per-sample columns; ``get_experience`` hands out ``count`` unconsumed samples in index
    order, padded into a TensorDict by MindSpeed-RL's own ``padding_dict_to_tensor_dict``;
    ``put_experience`` stores what the task writes back (unpadded by MindSpeed-RL's own code).
    """

    def __init__(self, columns):
        self.load(columns)

    def load(self, columns):
        """Start over with new columns (one dock serves many tests: each new actor is a new Ray worker
        process, seconds of CPU to import torch and MindSpeed-RL)."""
        self.columns = columns  # name -> list of 1-D tensors, one per sample
        self.n = len(next(iter(columns.values())))
        self.consumed = set()
        self.results = {}
        self.metrics = {}

    def update_metrics(self, key="", value=None, cumulate=False):
        """What workers send for the trainer's log: each key's values in the order they came."""
        self.metrics.setdefault(key, []).append(value)

    def metric(self, key):
        return self.metrics.get(key, [])

    def all_consumed(self, stage):
        return len(self.consumed) >= self.n

    def get_experience(self, stage, columns, count, indexes=None, **kwargs):
        from mindspeed_rl.utils.pad_process import padding_dict_to_tensor_dict

        if indexes is None:
            indexes = [i for i in range(self.n) if i not in self.consumed][:count]
        self.consumed.update(indexes)
        data = {c: [self.columns[c][i] for i in indexes] for c in columns}
        return padding_dict_to_tensor_dict(data), list(indexes)

    def put_experience(self, data_dict, indexes):
        from mindspeed_rl.utils.pad_process import remove_padding_tensor_dict_to_dict

        rows = remove_padding_tensor_dict_to_dict(data_dict)
        for key, values in rows.items():
            for i, value in zip(indexes, values):
                self.results.setdefault(key, {})[i] = value

    def result(self, key):
        return self.results.get(key, {})


_dock = []


def fresh_dock(columns):
    """The session's one :class:`StandInTransferDock`, loaded with ``columns`` and nothing else."""
    if not _dock:
        _dock.append(StandInTransferDock.remote(columns))
    else:
        ray.get(_dock[0].load.remote(columns))
    return _dock[0]


def dock_columns(scores, lengths, width=None):
    """Columns for ``len(scores)`` samples: responses of the given lengths (token ids 5), scores (1,)."""
    width = width or max(lengths)
    return {
        "responses": [torch.full((int(length),), 5, dtype=torch.int64) for length in lengths],
        "rm_scores": [torch.tensor([float(s)]) for s in scores],
        "response_length": [torch.tensor([int(length)]) for length in lengths],
    }


def run_python(code_or_args, env=None, cwd=None, timeout=300):
    """Run the MindSpeed-RL environment's Python (this interpreter) with ``env`` added."""
    full_env = dict(os.environ)
    full_env.pop("RLHF_EXT_PLUGINS", None)
    full_env.update(env or {})
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
    return subprocess.run([sys.executable, *args], env=full_env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
