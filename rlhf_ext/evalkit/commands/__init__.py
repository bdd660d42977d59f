"""The ``evalkit`` subcommands, one module each with ``add_arguments(parser)`` and ``run(args) -> int``
(rows of ``rlhf_ext.evalkit.cli.SUBCOMMANDS``, dispatched by :mod:`rlhf_ext.ground.subcommands` as
``rlhf-ext``'s are): :mod:`.evaluate` (``evalkit TASK``), :mod:`.custom` (``evalkit run``),
:mod:`.listing` (``evalkit list``), :mod:`.report`, :mod:`.compare`; ``evalkit audit`` and
``evalkit sweep`` are :mod:`rlhf_ext.evalkit.audit` and :mod:`rlhf_ext.evalkit.sweep`.

This package holds only the epilog texts the command table shows before a module is imported.
"""

EPILOG = """\
examples:
  evalkit aime --model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --tp 1 --dp 8
  evalkit math500 --model ckpt/step_200 --n-samples 4 --data ../shared/data/math500.jsonl
  evalkit report evalkit_runs/step_200/math500-1a2b3c4d5e
  evalkit compare runs/step_100 runs/step_200

Defaults follow the DeepSeek-R1 protocol: temperature 0.6, top_p 0.95, 32768 new tokens,
64 samples per problem, avg@64 (= pass@1) and maj@64 (cons@64) reported. Rerunning the same
command resumes into the same directory and generates only the missing samples.
"""


CUSTOM_EPILOG = """\
examples:
  evalkit run --model ckpt/step_200 --data my_problems.jsonl --name my_task --n-samples 8
  evalkit run --model M --data train.jsonl --name train --problem-key prompt --answer-key label --template chat
  evalkit run --resume --output evalkit_runs/step_200/my_task-1a2b3c4d5e

Any JSONL with one problem and its gold answer per line is a task: the same records, metrics,
resume and 'evalkit compare' as the built-in benchmarks, under the name given by --name. Without
--problem-key/--answer-key/--id-key the usual fields are tried (problem/question, answer, id/
unique_id/idx; no id field: the line number is the id).
"""
