"""The distillation teacher in OpenRLHF: its own Ray actor group, scoring every rollout batch.

Placement: a :class:`TeacherModelActor` group sized like the reference model (``--ref.num_nodes`` x
``--ref.num_gpus_per_node`` ranks, each holding every teacher of ``--rlhf_ext.teacher`` loaded as
OpenRLHF loads the reference model: ``openrlhf.models.Actor`` with ``--ds.param_dtype``, a DeepSpeed
eval engine, ``--ref.offload`` honoured). It is created by the PPOTrainer actor at the first rollout
batch, so it needs devices of its own (as many as the reference model; CPU target: none); the
reference model and KL-to-initial monitoring are unchanged.

Per batch (patched ``RemoteExperienceMaker.make_experience``): the teacher forward is dispatched
before OpenRLHF's own forwards (so it overlaps them on separate devices) and gathered after; each
sample gets, in ``Experience.info`` (the one per-sample carrier that survives OpenRLHF's replay
buffer split and re-batching), the teacher's log-probs of the sampled tokens ``[A]`` (float32, at
``--rollout.temperature``, as the student's), and for ``forward_kl_topk`` its top-k ids and
log-probs ``[A, k]``. :mod:`.distill_loss` takes them out in the actor's training step.

Several teachers: ``KEY=PATH`` entries; each sample's key is its prompt row's data field
``--rlhf_ext.distill.teacher_key``, read from ``--data.prompt_dataset`` (OpenRLHF carries only the
prompt and label to the rollouts, so the table is built once from the dataset, keyed by the prompt
as OpenRLHF renders it).
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Sequence

import ray
import torch

from .config import setting
from .distill_cli import DEFAULT_KEY, parse_teacher_spec

INFO_PREFIX = "rlhf_ext_teacher/"
LOG_PROBS_KEY = INFO_PREFIX + "log_probs"
TOPK_IDS_KEY = INFO_PREFIX + "topk_ids"
TOPK_LOG_PROBS_KEY = INFO_PREFIX + "topk_log_probs"
TEACHER_INFO_KEYS = (LOG_PROBS_KEY, TOPK_IDS_KEY, TOPK_LOG_PROBS_KEY)


def teacher_spec(args) -> Optional[Dict[str, str]]:
    spec = setting(args, "rlhf_ext.teacher")
    return parse_teacher_spec(spec) if spec else None


def uses_topk(args) -> int:
    """The top-k size the teacher must return (0: the loss needs only the sampled tokens' log-probs)."""
    from rlhf_ext.algorithms import get_distillation_loss

    mode = setting(args, "rlhf_ext.distill.loss_mode", "k3")
    return int(setting(args, "rlhf_ext.distill.topk", 128)) if getattr(get_distillation_loss(mode), "uses_topk",
                                                                        False) else 0  # fmt: skip


def score_sequences(model, sequences, action_mask, attention_mask, topk: int, ring_attn_group=None,
                    student_vocab: Optional[int] = None):
    """The teacher's values for one batch: ``{"log_probs": [B, A], "topk_ids"/"topk_log_probs": [B, A, k]}``.

    ``model`` is an ``openrlhf.models.Actor`` (its logits are float32 and divided by the rollout
    temperature, as the student's); position ``t`` of the action axis scores ``sequences[:, t + 1]``
    (OpenRLHF's ``action_mask = attention_mask[1:]`` layout), padding holds 0. The top-k is taken over the
    first ``student_vocab`` ids (a teacher with a larger padded embedding, same tokenizer), of the
    teacher's log-softmax over its whole vocabulary.
    """
    n_actions = action_mask.shape[1]
    out = model(sequences, None, attention_mask, return_output=True, allgather_logits=True,
                ring_attn_group=ring_attn_group)  # fmt: skip
    logits = out["logits"][:, :-1, :][:, -n_actions:, :]
    log_probs_all = torch.log_softmax(logits.float(), dim=-1)
    targets = sequences[:, 1:][:, -n_actions:]
    keep = action_mask.bool()
    chosen = log_probs_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    result = {"log_probs": torch.where(keep, chosen, chosen.new_zeros(()))}
    if topk:
        values, ids = torch.topk(log_probs_all[..., :student_vocab] if student_vocab else log_probs_all, k=topk,
                                 dim=-1)  # fmt: skip
        result["topk_log_probs"] = torch.where(keep.unsqueeze(-1), values, values.new_zeros(()))
        result["topk_ids"] = torch.where(keep.unsqueeze(-1), ids, ids.new_zeros(()))
    return result


def _vocab_size(model_path: str) -> Optional[int]:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    return getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)


def _launcher():
    from openrlhf.trainer.ray import launcher

    return launcher


@ray.remote(num_gpus=1)
class TeacherModelActor(_launcher().BaseModelActor):
    """One rank of the teacher group: every teacher of ``--rlhf_ext.teacher``, in eval mode."""

    def init_model_from_pretrained(self, strategy, teachers: Dict[str, str]):
        from openrlhf.models import Actor

        self._setup_distributed(strategy)
        args = strategy.args
        self.models = {}
        for key, path in teachers.items():
            model = Actor(
                path,
                attn_implementation=args.ds.attn_implementation,
                experts_implementation=args.ds.experts_implementation,
                param_dtype=args.ds.param_dtype,
                load_in_4bit=args.ds.load_in_4bit,
                ds_config=strategy.get_ds_eval_config(offload=args.ref.offload),
                packing_samples=args.ds.packing_samples,
                temperature=args.rollout.temperature,
                use_liger_kernel=args.ds.use_liger_kernel,
            )
            if args.ref.offload:
                model._offload = True
            prepared = strategy.prepare(model)
            prepared.eval()
            self.models[key] = prepared
        self.topk = uses_topk(args)
        self.student_vocab = _vocab_size(args.actor.model_name_or_path)

    def forward(self, sequences, action_mask, attention_mask, teacher_keys: Sequence[str]):
        keys = list(teacher_keys)
        unknown = sorted(set(keys) - set(self.models))
        if unknown:
            raise ValueError(f"--rlhf_ext.teacher has no teacher for key(s) {unknown}; teachers: {sorted(self.models)}")
        n, n_actions = action_mask.shape
        out = {"log_probs": torch.zeros(n, n_actions, dtype=torch.float32)}
        if self.topk:
            out["topk_log_probs"] = torch.zeros(n, n_actions, self.topk, dtype=torch.float32)
            out["topk_ids"] = torch.zeros(n, n_actions, self.topk, dtype=torch.long)
        for key in sorted(set(keys)):
            rows = torch.tensor([i for i, k in enumerate(keys) if k == key], dtype=torch.long)
            model = self.models[key]
            device = next(model.parameters()).device
            with torch.no_grad():
                part = score_sequences(model, sequences[rows].to(device), action_mask[rows].to(device),
                                       attention_mask[rows].to(device), self.topk, self.strategy.ring_attn_group,
                                       self.student_vocab)  # fmt: skip
            for name, value in part.items():
                out[name][rows] = value.to("cpu", out[name].dtype)
        return out


class _RetargetedActorType:
    """What :class:`RayActorGroup` creates actors from: the class with its resource request translated for the
    target device (the plugin's retarget translates only classes defined in ``openrlhf.*``); on the CPU
    target no CPU is reserved either, as the other roles' 0.2-device shares reserve none."""

    def __init__(self, actor_class):
        self._actor_class = actor_class

    def options(self, **options):
        from rlhf_ext.npu.ray_resources import retarget_actor_options
        from rlhf_ext.patches.retarget.state import current_backend

        backend = current_backend()
        options = retarget_actor_options(options, backend)
        if backend == "cpu":
            options["num_cpus"] = 0
        return self._actor_class.options(**options)


class TeacherGroup:
    """The teacher actor group of one PPOTrainer, and the prompt -> teacher key table when routed."""

    def __init__(self, strategy, tokenizer, teachers: Dict[str, str]):
        args = strategy.args
        self.args, self.tokenizer, self.teachers = args, tokenizer, teachers
        duplicate = int(setting(args, "ds.ring_attn_size", 1)) * int(setting(args, "ds.tensor_parallel_size", 1))
        self.group = _launcher().RayActorGroup(
            args.ref.num_nodes, args.ref.num_gpus_per_node, _RetargetedActorType(TeacherModelActor),
            pg=None, num_gpus_per_actor=1, duplicate_actors=duplicate,
        )  # fmt: skip
        ray.get(self.group.async_init_model_from_pretrained(strategy, teachers))
        self.duplicate = duplicate
        self.strategy = strategy
        self._routes: Optional[Dict[str, str]] = None

    # -- routing --
    def _route_table(self) -> Dict[str, str]:
        if self._routes is None:
            self._routes = route_table(self.strategy, self.tokenizer, setting(self.args, "rlhf_ext.distill.teacher_key",
                                                                              "data_source"))  # fmt: skip
        return self._routes

    def keys_for(self, prompts: Sequence[str]) -> List[str]:
        if DEFAULT_KEY in self.teachers:
            return [DEFAULT_KEY] * len(prompts)
        table = self._route_table()
        field = setting(self.args, "rlhf_ext.distill.teacher_key", "data_source")
        keys = []
        for prompt in prompts:
            if prompt not in table:
                raise ValueError(f"--rlhf_ext.distill.teacher_key {field}: a rollout's prompt is not in "
                                 f"--data.prompt_dataset, so its teacher is unknown: {prompt[:200]!r}")  # fmt: skip
            keys.append(table[prompt])
        return keys

    # -- scoring --
    def dispatch(self, samples_list):
        return self.group.async_run_method_batch(
            method_name="forward",
            sequences=[s.sequences for s in samples_list],
            action_mask=[s.action_mask for s in samples_list],
            attention_mask=[s.attention_mask for s in samples_list],
            teacher_keys=[self.keys_for(list(s.prompts)) for s in samples_list],
        )  # fmt: skip

    def attach(self, experiences, refs) -> None:
        import itertools

        results = list(itertools.chain.from_iterable(ray.get(refs)[:: self.duplicate]))
        if len(results) != len(experiences):
            raise RuntimeError(f"teacher returned {len(results)} batches for {len(experiences)}")
        for exp, res in zip(experiences, results):
            exp.info[LOG_PROBS_KEY] = res["log_probs"]
            if "topk_ids" in res:
                exp.info[TOPK_IDS_KEY] = res["topk_ids"]
                exp.info[TOPK_LOG_PROBS_KEY] = res["topk_log_probs"]


def route_table(strategy, tokenizer, field: str) -> Dict[str, str]:
    """``{prompt as OpenRLHF renders it: str(row[field])}`` over ``--data.prompt_dataset`` (several teachers)."""
    from openrlhf.datasets.prompts_dataset import preprocess_data
    from openrlhf.datasets.utils import blending_datasets

    args = strategy.args
    data = blending_datasets(args.data.prompt_dataset, args.data.prompt_probs, strategy, args.train.seed,
                             max_count=args.data.max_samples, dataset_split=args.data.prompt_split)  # fmt: skip
    template = tokenizer.apply_chat_template if args.data.apply_chat_template else None
    table: Dict[str, str] = {}
    for i, row in enumerate(data):
        if field not in row or row[field] is None:
            raise ValueError(f"--rlhf_ext.distill.teacher_key {field}: row {i} of --data.prompt_dataset has no "
                             f"field {field!r} (its fields: {sorted(row)})")  # fmt: skip
        prompt, _ = preprocess_data(row, args.data.input_template, args.data.input_key, args.data.label_key, template)
        table[prompt] = str(row[field])
    return table


def make_make_experience(original, module=None):
    """``RemoteExperienceMaker.make_experience``: the teacher's values joined to each experience."""

    @functools.wraps(original)
    def make_experience(self, samples_list):
        teachers = teacher_spec(self.strategy.args)  # the maker's self.args is this object
        if not teachers:
            return original(self, samples_list)
        group = self.__dict__.get("_rlhf_ext_teacher")
        if group is None:
            group = TeacherGroup(self.strategy, self.tokenizer, teachers)
            self.__dict__["_rlhf_ext_teacher"] = group
        refs = group.dispatch(samples_list)  # before OpenRLHF's forwards: the teacher has its own devices
        experiences = original(self, samples_list)
        group.attach(experiences, refs)
        return experiences

    return make_experience


__all__ = ["LOG_PROBS_KEY", "TEACHER_INFO_KEYS", "TOPK_IDS_KEY", "TOPK_LOG_PROBS_KEY", "TeacherGroup",
           "TeacherModelActor", "make_make_experience", "route_table", "score_sequences", "teacher_spec", "uses_topk"]
