"""The run record: one package owns the ``rlhf_ext.run/1`` format (docs/run_records.md), framework-free.

A run directory holds ``config.json``, ``metrics.jsonl``, ``events.jsonl``, ``rollout_samples.jsonl``
and, after a guard stop, ``incident.json``. Every reader and writer goes through this package
(the report, ``runs check``, the queue, evalkit's sweep, the host glue); it imports only the ground
floor (:mod:`rlhf_ext.ground`).

* :mod:`~rlhf_ext.runs.files` -- the file names, the schema, metric names, the lines of
  ``metrics.jsonl`` / ``events.jsonl`` and writing / reading them (torn-line safe).
* :mod:`~rlhf_ext.runs.samples` -- ``rollout_samples.jsonl``: which rollouts, their lines, reading them.
* :mod:`~rlhf_ext.runs.status` -- a run's status from its events (:func:`run_status`).
* :mod:`~rlhf_ext.runs.writer` -- :class:`RunWriter`, the one writer of a run's files during training.
* :mod:`~rlhf_ext.runs.throughput` / :mod:`~rlhf_ext.runs.flops` -- per-step throughput, model FLOPs, MFU.
* :mod:`~rlhf_ext.runs.summary` -- the text of ``rlhf-ext runs show``.
* :mod:`~rlhf_ext.runs.check` -- ``rlhf-ext runs check``: did the run learn, is it healthy.
* :mod:`~rlhf_ext.runs.tensorboard` -- ``rlhf-ext runs export``.
* :mod:`~rlhf_ext.runs.cli` -- the ``rlhf-ext runs`` command.

``from rlhf_ext import runs`` gives the names below (``runs.read_metrics``, ``runs.METRICS``, ...).
"""

from .files import (CONFIG, EVENTS, INCIDENT, KEPT_PREFIXES, METRICS, OPENRLHF_PREFIXES, OWN_PREFIXES, POLICY_LAG,
                    POLICY_LAG_MAX, RESERVED_KEYS, ROLLOUT_SAMPLES, SCHEMA, SCHEMA_PREFIX, SCHEMA_VERSION, append_jsonl,
                    as_number, event_record, metric_name, metrics_record, read_jsonl, read_jsonl_numbered, read_metrics,
                    repair_tail, rewrite_jsonl, truncate_metrics_after, write_json_atomic)
from .samples import (SAMPLE_TEXT_CHARS, SAMPLES_PER_STEP, SAMPLES_TOTAL, prompt_id, read_rollout_samples,
                      rollout_sample_record, select_rollout_samples)
from .status import END_STATUSES, RUNNING, UNKNOWN, run_status
from .summary import KEY_METRICS, summarize
from .tensorboard import export_tensorboard, tensorboard_tag_name
from .writer import RunWriter

__all__ = [
    "CONFIG", "EVENTS", "INCIDENT", "KEPT_PREFIXES", "METRICS", "OPENRLHF_PREFIXES", "OWN_PREFIXES", "POLICY_LAG",
    "POLICY_LAG_MAX", "RESERVED_KEYS", "ROLLOUT_SAMPLES", "SCHEMA", "SCHEMA_PREFIX", "SCHEMA_VERSION", "append_jsonl",
    "as_number", "event_record", "metric_name", "metrics_record", "read_jsonl", "read_jsonl_numbered", "read_metrics",
    "repair_tail", "rewrite_jsonl", "truncate_metrics_after", "write_json_atomic",
    "SAMPLE_TEXT_CHARS", "SAMPLES_PER_STEP", "SAMPLES_TOTAL", "prompt_id", "read_rollout_samples",
    "rollout_sample_record", "select_rollout_samples",
    "END_STATUSES", "RUNNING", "UNKNOWN", "run_status",
    "KEY_METRICS", "summarize",
    "export_tensorboard", "tensorboard_tag_name",
    "RunWriter",
]  # fmt: skip
