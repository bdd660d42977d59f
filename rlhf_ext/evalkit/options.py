"""What one evaluation run is asked to do: :class:`RunOptions` (the DeepSeek-R1 protocol by default)
and their checks; the ``evalkit`` command line builds them from its flags (:mod:`.commands.evaluate`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from .tasks import Task, custom_task, suite_tasks
from .templates import DEFAULT_TEMPLATE, TEMPLATES


@dataclass
class RunOptions:
    """Everything a run needs; the defaults are the DeepSeek-R1 protocol (the evaluation setup of
    the DeepSeek-R1 paper, arXiv 2501.12948; docs/evalkit.md, "Defaults")."""

    suite: str
    model: str
    output: Optional[Path] = None
    n_samples: int = 64
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = -1  # -1: off (vLLM's 0 / OpenRLHF's --rollout.top_k -1)
    min_p: float = 0.0  # 0: off
    max_tokens: int = 32768
    template: str = DEFAULT_TEMPLATE
    system_prompt: Optional[str] = None
    template_text: Optional[str] = None  # the user template of template="file" (one "{}")
    seed: int = 0
    tp: int = 1
    dp: int = 1
    limit: Optional[int] = None
    data: Sequence[str] = field(default_factory=tuple)
    resume: bool = False
    ray_address: Optional[str] = None
    gpu_memory_utilization: Optional[float] = None
    kv_cache: Optional[str] = None
    enforce_eager: Optional[bool] = None
    max_model_len: Optional[int] = None
    dtype: str = "auto"
    trust_remote_code: bool = False
    grader_workers: Optional[int] = None
    grade_timeout: float = 5.0
    # False: an answer without an anchor (\boxed{}, "the answer is", ...) is graded on the response's
    # last math expression, as lighteval / math-verify grade published numbers; True: as the rewards.
    require_anchor: bool = False
    bootstrap_resamples: int = 2000
    progress: bool = True
    # A task over any JSONL (``evalkit run``): {"name", "problem_key", "answer_key", "id_key"}; its
    # name is the suite, and ``data`` holds exactly its one file.
    custom_task: Optional[dict] = None
    # choice/ranking tasks: show each sample's options in its own order, re-lettered, with a
    # permutation drawn from this seed, the task, the problem and the sample index (None: as written)
    shuffle_options: Optional[int] = None
    # the verifier cascade (rlhf_ext.evalkit.verifier): an OpenAI-compatible endpoint and its model,
    # asked about the samples the rules score wrong; None: rules only
    verifier_url: Optional[str] = None
    verifier_model: Optional[str] = None
    verifier_timeout: float = 30.0
    verifier_concurrency: int = 8
    verifier_max_tokens: int = 16
    verifier_vllm_choice: bool = False

    def verifier_settings(self):
        """The :class:`~rlhf_ext.rewards.verifier_cascade.VerifierSettings` of the run, or None (rules only)."""
        if self.verifier_url is None and self.verifier_model is None:
            return None
        if not (self.verifier_url and self.verifier_model):
            raise ValueError("--verifier-url and --verifier-model go together (the server and the model it serves)")
        from rlhf_ext.rewards.verifier_cascade import VerifierSettings

        return VerifierSettings(url=self.verifier_url, model=self.verifier_model, timeout=self.verifier_timeout,
                                concurrency=self.verifier_concurrency,
                                max_tokens=self.verifier_max_tokens,
                                vllm_choice=self.verifier_vllm_choice).validate()

    @property
    def answer_type(self) -> str:
        return (self.custom_task or {}).get("answer_type") or "math"

    def task_definition(self) -> Optional[Task]:
        if self.custom_task is None:
            return None
        spec = dict(self.custom_task)
        if spec.get("name") != self.suite:
            raise ValueError(f"custom task {spec.get('name')!r} must be run under its own name, not {self.suite!r}")
        return custom_task(**spec)

    def validate(self) -> None:
        if self.custom_task is not None:
            self.task_definition()
            if len(self.data) != 1:
                raise ValueError(f"custom task {self.suite!r} needs exactly one --data FILE, got {len(self.data)}")
        else:
            suite_tasks(self.suite)
        checks = [
            (self.n_samples >= 1, f"--n-samples must be >= 1, got {self.n_samples}"),
            (self.temperature >= 0, f"--temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}"),
            (isinstance(self.top_k, int) and (self.top_k == -1 or self.top_k >= 1),
             f"--top-k must be -1 (off) or >= 1, got {self.top_k}"),
            (0 <= self.min_p <= 1, f"--min-p must be in [0, 1] (0: off), got {self.min_p}"),
            (self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}"),
            (self.tp >= 1, f"--tp must be >= 1, got {self.tp}"),
            (self.dp >= 1, f"--dp must be >= 1, got {self.dp}"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
            (self.template in TEMPLATES, f"--template must be one of {', '.join(TEMPLATES)}, got {self.template!r}"),
            ((self.template == "file") == (self.template_text is not None),
             "--template file goes with --template-file FILE (and a template text only with it)"),
            (self.grade_timeout > 0, f"--grade-timeout must be > 0, got {self.grade_timeout}"),
            (self.bootstrap_resamples >= 100, f"--bootstrap-resamples must be >= 100, got {self.bootstrap_resamples}"),
        ]
        if self.shuffle_options is not None and self.answer_type == "math":
            checks.append((False, "--shuffle-options needs --answer-type choice or ranking"))
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self.verifier_settings()
