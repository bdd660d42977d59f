"""Non-finite guard (``--rlhf_ext.guard stop|warn|off``, default ``stop``) in OpenRLHF's PolicyModelActor.

Why: with bf16 and ZeRO-1/2, DeepSpeed 0.19 zeroes non-finite gradients and skips the step without a
log line, and OpenRLHF then logs the previous step's grad norm; with ZeRO-3 a non-finite norm
becomes -1 and the NaN gradients reach Adam (docs/run_records.md). The guard checks, in every
micro-batch of ``ActorPPOTrainer.training_step``:

* before backward (patched ``DeepspeedStrategy.backward``): advantages, the largest |log-ratio|
  between the current and the rollout-time policy, the policy loss, the entropy (when OpenRLHF
  computes it) and the total loss are finite, and no input check of :mod:`rlhf_ext.algorithms`
  met a NaN/Inf in this micro-batch: the training step runs under
  :func:`rlhf_ext.algorithms.deferred_finite_checks`, so a registered loss (or estimator, KL
  term, ...) that produces a NaN does not end the run with the check's ``ValueError`` before the
  guard sees it; the first such finding is the incident's ``origin``;
* at the gradient-accumulation boundary, before ``DeepspeedStrategy.optimizer_step``: the
  gradients are finite, read without side effects (the fp32 accumulation buffers of DeepSpeed's
  bf16 / ZeRO optimizers and any ``param.grad``; never ``has_overflow()``, which resets ZeRO-3's
  state).

Each verdict is one ``all_reduce(MAX)`` over the actor's ranks, so all ranks act together (a
rank that stopped alone would leave the others hanging in the next collective). ``stop``: no
backward / no optimizer step, ``incident.json`` is written by the lowest failing rank and every
rank raises :class:`GuardStop`; the driver exits with :data:`GUARD_EXIT_CODE`, and no checkpoint
is written after the incident. ``warn``: a ``guard_incident`` event and the
``rlhf_ext/guard/incidents`` counter. In every mode the recorded ``train/actor_grad_norm`` is NaN
when DeepSpeed skipped the step (or reported -1) instead of a stale value, and DeepSpeed's
skipped-step count is recorded as ``rlhf_ext/ds_skipped_steps``.

Test-only poison hook: ``RLHF_EXT_TEST_POISON="step=2,tensor=loss|grad,rank=0"`` puts a NaN into
the loss (before the check) or into one gradient (at the boundary, before the check) of that rank
at that global step (counted from this process's start: the global step on a fresh run).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from rlhf_ext import runs
from rlhf_ext.algorithms import deferred_finite_checks

from . import run_record
from .config import setting
from .guard_stop import GUARD_EXIT_CODE, STOP_MARKER, GuardStop, is_guard_stop

GUARD_MODES = ("stop", "warn", "off")
POISON_ENV = "RLHF_EXT_TEST_POISON"
CHECKED_TENSORS = ("advantages", "log_ratio", "policy_loss", "entropy", "loss", "input_check")
"""Checked before backward, in this order; the first non-finite one names the incident. ``input_check``:
an input check of :mod:`rlhf_ext.algorithms` found a NaN/Inf that reached none of the others."""


def guard_mode(args) -> str:
    """``--rlhf_ext.guard``; ``off`` when ``args`` was built without the plugin's parser."""
    mode = setting(args, "rlhf_ext.guard", "off")
    if mode not in GUARD_MODES:
        raise ValueError(f"--rlhf_ext.guard must be one of {', '.join(GUARD_MODES)}, got {mode!r}")
    return mode


def parse_poison(text: Optional[str]) -> Optional[Dict[str, Any]]:
    """``"step=2,tensor=loss,rank=0"`` -> dict; ``None``/empty -> None; anything malformed raises ValueError."""
    if not text:
        return None
    spec: Dict[str, Any] = {"rank": 0}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in ("step", "tensor", "rank"):
            raise ValueError(f"{POISON_ENV}: expected step=N,tensor=loss|grad[,rank=R], got {text!r}")
        try:
            spec[key] = value.strip() if key == "tensor" else int(value)
        except ValueError:
            raise ValueError(f"{POISON_ENV}: {key} must be an integer, got {text!r}") from None
    if spec.get("tensor") not in ("loss", "grad") or "step" not in spec:
        raise ValueError(f"{POISON_ENV}: expected step=N,tensor=loss|grad[,rank=R], got {text!r}")
    return spec


# --- checks (framework-free) --------------------------------------------------------------------


def _masked(t: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    if mask is None or mask.shape != t.shape:
        return t
    return torch.where(mask.bool(), t, torch.zeros((), dtype=t.dtype, device=t.device))


def bad_rows(t: Optional[torch.Tensor], mask: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """Per-sample non-finite flags of a (B, ...) tensor over its masked entries; a 0-d tensor gives one flag."""
    if t is None:
        return None
    t = _masked(t.detach(), mask)
    finite = torch.isfinite(t)
    if t.dim() == 0:
        return ~finite.reshape(1)
    return ~finite.reshape(t.shape[0], -1).all(dim=1)


def nonfinite_stats(t: Optional[torch.Tensor], mask: Optional[torch.Tensor] = None) -> Dict[str, Any]:
    """NaN and Inf counts and the first non-finite index of ``t`` over its masked entries (for the incident)."""
    if t is None:
        return {}
    t = t.detach()
    bad = ~torch.isfinite(t)
    if mask is not None and mask.shape == t.shape:
        bad = bad & mask.bool()
    n_nan = int((torch.isnan(t) & bad).sum())
    first = [int(i) for i in bad.nonzero()[0]] if bool(bad.any()) else None
    return {"nan_count": n_nan, "inf_count": int(bad.sum()) - n_nan, "first_index": first}


def max_abs_log_ratio(log_probs, old_log_probs, mask) -> Optional[torch.Tensor]:
    """max |log pi - log pi_old| over response tokens per sample (NaN/Inf propagate; reported as a metric)."""
    if log_probs is None or old_log_probs is None or log_probs.shape != old_log_probs.shape:
        return None
    diff = (log_probs.detach().float() - old_log_probs.detach().float()).abs()
    diff = _masked(diff, mask)
    return diff.reshape(diff.shape[0], -1).amax(dim=1)


def grad_tensors(engine) -> List[torch.Tensor]:
    """The gradients a DeepSpeed engine will step with, read without side effects.

    DeepSpeed keeps them in different places: ``param.grad`` (plain optimizers, ZeRO-0 before the
    bf16 optimizer folds them), the fp32 flat buffers of ``BF16_Optimizer``
    (``fp32_groups_gradients_flat``), ZeRO-1/2's ``averaged_gradients`` and the fp32 partitions'
    ``.grad``, ZeRO-3's ``averaged_gradients`` / ``fp32_partitioned_groups_flat``. Each rank reads
    its own part; the verdict is combined across ranks by the caller.
    """
    out: List[torch.Tensor] = []
    module = getattr(engine, "module", engine)
    for p in module.parameters():
        if p.grad is not None:
            out.append(p.grad)
    opt = getattr(engine, "optimizer", None)
    if opt is None:
        return out
    for attr in ("fp32_groups_gradients_flat",):
        for t in getattr(opt, attr, None) or []:
            if isinstance(t, torch.Tensor):
                out.append(t)
    averaged = getattr(opt, "averaged_gradients", None)
    if isinstance(averaged, dict):
        for group in averaged.values():
            for t in group or []:
                if isinstance(t, torch.Tensor):
                    out.append(t)
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        for t in getattr(opt, attr, None) or []:
            if isinstance(t, torch.Tensor) and t.grad is not None:
                out.append(t.grad)
    return out


def grads_nonfinite(grads: Sequence[torch.Tensor]) -> bool:
    """Any NaN/Inf among ``grads``.

    Fast path: one fused ``foreach`` 2-norm per dtype/device (a memory-bound pass, ~1 ms for 4M
    parameters on one CPU core); a norm is finite iff every entry is finite, unless the squares of
    huge finite entries overflow, so a non-finite norm is confirmed by an exact ``isfinite`` pass
    (only then, i.e. only on incidents).
    """
    if not grads:
        return False
    by_kind: Dict[Tuple[torch.dtype, torch.device], List[torch.Tensor]] = {}
    for t in grads:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    suspects: List[torch.Tensor] = []
    for group in by_kind.values():
        norms = torch.stack([n.float() for n in torch._foreach_norm(group, 2)])
        finite = torch.isfinite(norms)
        if not bool(finite.all()):
            suspects.extend(t for t, ok in zip(group, finite.tolist()) if not ok)
    return any(not bool(torch.isfinite(t).all()) for t in suspects)


# --- the guard in the actor ---------------------------------------------------------------------


class _MicroBatch:
    """What one ``training_step`` call exposes to the strategy hooks."""

    def __init__(self, trainer, experience, step: int):
        self.trainer, self.experience, self.step = trainer, experience, step
        self.log_probs = None
        self.entropy = None
        self.policy_loss = None
        self.findings: List[Dict[str, Any]] = []  # what the deferred input checks met in this micro-batch
        self.checked_findings = 0  # how many of them the check before backward saw
        self.skipped = False
        self.skipped_steps = None


class Guard:
    def __init__(self, trainer):
        self.args = trainer.args
        self.strategy = trainer.strategy
        self.mode = guard_mode(self.args)
        self.incidents = 0
        # global steps trained by this process (ppo_train calls): the global step on a fresh run; the
        # PPOTrainer, which knows the true global step, corrects incident records after a resume
        self.train_calls = 0
        self.poison = parse_poison(os.environ.get(POISON_ENV))
        self.max_log_ratio = 0.0

    # -- collectives --
    def _rank_world(self) -> Tuple[int, int]:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _combine(self, flags: torch.Tensor, device: Optional[torch.device] = None) -> Tuple[torch.Tensor, int]:
        """(flags OR-ed over ranks, lowest failing rank or -1): one all_reduce(MAX).

        ``device``: where the collective runs for device backends (NCCL/HCCL): the device of the
        tensors being checked; gloo reduces on the CPU."""
        import torch.distributed as dist

        rank, world = self._rank_world()
        big = float(1 << 20)
        local_bad = bool(flags.any())
        vec = torch.cat([flags.float().reshape(-1), torch.tensor([big - rank if local_bad else 0.0])])
        if world > 1:
            if dist.get_backend() != "gloo" and device is not None:
                vec = vec.to(device)
            dist.all_reduce(vec, op=dist.ReduceOp.MAX)
            vec = vec.cpu()
        first_bad = int(big - vec[-1].item()) if vec[-1].item() > 0 else -1
        return vec[:-1] > 0, first_bad

    # -- checks --
    def _poisoned(self, tensor: str, step: int) -> bool:
        p = self.poison
        return bool(p) and p["tensor"] == tensor and p["step"] == step and p["rank"] == self._rank_world()[0]

    def before_backward(self, mb: _MicroBatch, loss: torch.Tensor) -> torch.Tensor:
        if self._poisoned("loss", self.train_calls):
            loss = loss + float("nan")
        exp = mb.experience
        mask = getattr(exp, "action_mask", None)
        ratio = max_abs_log_ratio(mb.log_probs, getattr(exp, "action_log_probs", None), mask)
        entropy = mb.entropy
        if entropy is not None and mask is not None and entropy.dim() == 2:
            entropy = entropy[:, -mask.shape[1]:]
        rows = {
            "advantages": bad_rows(getattr(exp, "advantages", None), mask),
            "log_ratio": bad_rows(ratio),
            "policy_loss": bad_rows(mb.policy_loss),
            "entropy": bad_rows(entropy, mask),
            "loss": bad_rows(loss),
            "input_check": torch.tensor([bool(mb.findings)]),
        }
        mb.checked_findings = len(mb.findings)
        masks = {"advantages": mask, "entropy": mask}
        values = {"advantages": getattr(exp, "advantages", None), "log_ratio": ratio, "policy_loss": mb.policy_loss,
                  "entropy": entropy, "loss": loss}  # fmt: skip
        if ratio is not None and ratio.numel():
            value = float(ratio.max())
            if math.isfinite(value):
                self.max_log_ratio = max(self.max_log_ratio, value)
        flags = torch.stack([torch.as_tensor(bool(r.any())) if r is not None else torch.tensor(False)
                             for r in rows.values()])  # fmt: skip
        combined, first_rank = self._combine(flags, loss.device)
        if bool(combined.any()):
            tensor = CHECKED_TENSORS[int(combined.nonzero()[0])]
            local = rows[tensor]
            stats = nonfinite_stats(values.get(tensor), masks.get(tensor)) if tensor in values else {}
            self._incident(mb, tensor, first_rank, local, stats)
        return loss

    def before_step(self, mb: _MicroBatch, engine) -> None:
        step = self.train_calls
        grads = grad_tensors(engine)
        if self._poisoned("grad", step) and grads:
            with torch.no_grad():
                grads[0].view(-1)[0] = float("nan")
        bad = grads_nonfinite(grads)
        combined, first_rank = self._combine(torch.tensor([bad]), grads[0].device if grads else None)
        if bool(combined.any()):
            self._incident(mb, "grad", first_rank, None)

    def _incident(self, mb: _MicroBatch, tensor: str, first_rank: int, local_rows, stats=None) -> None:
        rank, _ = self._rank_world()
        step = self.train_calls
        self.incidents += 1
        exp = mb.experience
        if local_rows is not None and local_rows.numel() > 1:
            rows = [i for i, bad in enumerate(local_rows.tolist()) if bad]
        else:
            rows = list(range(int(exp.action_mask.shape[0]))) if getattr(exp, "action_mask", None) is not None else []
        index = getattr(exp, "index", None) or []
        prompts = getattr(exp, "prompts", None) or []
        detail = {
            "step": step,
            "micro_batch": mb.step,
            "tensor": tensor,
            "rank": first_rank if first_rank >= 0 else rank,
            "sample_indices": [index[i] if i < len(index) else i for i in rows],
            "prompts": [prompts[i] for i in rows if i < len(prompts)],
            "mode": self.mode,
            **(stats or {}),
        }
        loss_type = getattr(getattr(mb.trainer, "actor_loss_fn", None), "policy_loss_type", None)
        if loss_type is not None:
            detail["policy_loss_type"] = loss_type
        if mb.findings:
            # the first input check that met the NaN/Inf: names the producer's output (e.g. a registered
            # loss's per_token_loss), with its own counts and index
            detail["origin"] = dict(mb.findings[0])
            if tensor == "input_check":
                detail.update({k: mb.findings[0][k] for k in ("nan_count", "inf_count", "first_index")})
        if self.mode == "warn":
            if rank == max(first_rank, 0):
                extra = {"origin": detail["origin"]["name"]} if "origin" in detail else {}
                run_record.add_event("guard_incident", None, tensor=tensor, rank=detail["rank"], mode="warn",
                                     micro_batch=mb.step, **extra)  # fmt: skip
            return
        # stop: the lowest failing rank writes the record (it has the samples); everyone stops
        path = run_record.run_dir(self.args)
        if path and rank == max(first_rank, 0):
            detail.update({
                "last_good_checkpoint": last_good_checkpoint(self.args),
                "time": time.time(),
                "weights_sha256": weights_digest(mb.trainer.actor),
            })  # fmt: skip
            Path(path).mkdir(parents=True, exist_ok=True)
            runs.write_json_atomic(Path(path) / runs.INCIDENT, detail)
        if self._rank_world()[1] > 1:
            # every rank got the same verdict and is here: wait for the record, so that the driver,
            # which reads it when the first rank's GuardStop arrives, never finds it missing
            import torch.distributed as dist

            dist.barrier()
        origin = f" (first met by the input check of {detail['origin']['name']})" if "origin" in detail else ""
        raise GuardStop(
            f"{STOP_MARKER}: non-finite {tensor}{origin} at step {step}, micro-batch {mb.step}, rank {detail['rank']}; "
            f"no optimizer step was taken (incident record: {path}/{runs.INCIDENT})"
        )


def last_good_checkpoint(args) -> Optional[str]:
    """The newest DeepSpeed checkpoint OpenRLHF has written (``ckpt.path/_actor/latest``), else the HF one."""
    ckpt = setting(args, "ckpt.path")
    if not ckpt:
        return None
    latest = Path(ckpt) / "_actor" / "latest"
    if latest.exists():
        return str(Path(ckpt) / "_actor" / latest.read_text().strip())
    hf = sorted(Path(ckpt).glob("global_step*_hf"), key=lambda p: int("".join(c for c in p.name if c.isdigit()) or 0))
    return str(hf[-1]) if hf else None


def weights_digest(actor) -> Dict[str, str]:
    """sha256 of each parameter's bytes on this rank (names as in the HF model), to prove no step was taken."""
    import hashlib

    model = getattr(actor, "model", actor)
    module = getattr(model, "module", model)
    out = {}
    for name, p in module.named_parameters():
        data = p.detach().cpu().contiguous()
        out[name] = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()
    return out


def tensor_digest(t: torch.Tensor) -> str:
    import hashlib

    data = t.detach().cpu().contiguous()
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()


# --- patches ------------------------------------------------------------------------------------

_active = threading.local()


def _current(strategy) -> Optional[_MicroBatch]:
    mb = getattr(_active, "mb", None)
    if mb is not None and mb.trainer.strategy is strategy:
        return mb
    return None


def _guard_of(trainer) -> Guard:
    guard = trainer.__dict__.get("_rlhf_ext_guard")
    if guard is None:
        guard = Guard(trainer)
        trainer.__dict__["_rlhf_ext_guard"] = guard
    return guard


def make_backward(original, module=None):
    @functools.wraps(original)
    def backward(self, loss, model, _optimizer, **kwargs):
        mb = _current(self)
        if mb is not None:
            guard = _guard_of(mb.trainer)
            if guard.mode != "off":
                loss = guard.before_backward(mb, loss)
        return original(self, loss, model, _optimizer, **kwargs)

    return backward


def _engine(model):
    inner = getattr(model, "model", None)
    return inner if inner is not None and hasattr(inner, "is_gradient_accumulation_boundary") else model


def make_optimizer_step(original, module=None):
    @functools.wraps(original)
    def optimizer_step(self, _optimizer, model, _scheduler, name="model", **kwargs):
        mb = _current(self)
        engine = _engine(model)
        boundary = True
        if hasattr(engine, "is_gradient_accumulation_boundary"):
            boundary = bool(engine.is_gradient_accumulation_boundary())
        if mb is not None and boundary:
            guard = _guard_of(mb.trainer)
            if guard.mode != "off":
                guard.before_step(mb, engine)
        before = getattr(engine, "skipped_steps", None)
        out = original(self, _optimizer, model, _scheduler, name=name, **kwargs)
        if mb is not None and boundary:
            after = getattr(engine, "skipped_steps", None)
            if isinstance(before, int) and isinstance(after, int):
                mb.skipped = after > before
                mb.skipped_steps = after
        return out

    return optimizer_step


def make_training_step(original, module=None):
    """Expose the micro-batch to the strategy hooks; capture the tensors OpenRLHF keeps local."""

    @functools.wraps(original)
    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        guard = _guard_of(self)
        mb = _MicroBatch(self, experience, step)
        handles = []
        if guard.mode != "off":
            def on_actor(_module, _inputs, output):
                if isinstance(output, tuple) and len(output) == 2:
                    mb.log_probs = output[0]
                    mb.entropy = getattr(output[1], "entropy", None) if output[1] is not None else None
                    if mb.entropy is None and isinstance(output[1], dict):
                        mb.entropy = output[1].get("entropy")

            def on_loss(_module, _inputs, output):
                if isinstance(output, tuple) and output:
                    mb.policy_loss = output[0]

            handles.append(self.actor.register_forward_hook(on_actor))
            loss_fn = getattr(self, "actor_loss_fn", None)
            if isinstance(loss_fn, torch.nn.Module):
                handles.append(loss_fn.register_forward_hook(on_loss))
        _active.mb = mb
        try:
            if guard.mode != "off":
                with deferred_finite_checks() as mb.findings:
                    status = original(self, experience, kl_ctl, step, loss_batch_info)
            else:
                status = original(self, experience, kl_ctl, step, loss_batch_info)
        finally:
            _active.mb = None
            for h in handles:
                h.remove()
        late = mb.findings[mb.checked_findings:]
        if late:
            # met after the check before backward (a metric of the step): nothing to stop, but not silent
            first = late[0]
            run_record.add_event("nonfinite_input", None, where="training_step", check=first["name"],
                                 **{k: v for k, v in first.items() if k != "name"})  # fmt: skip
        metrics = status.get("metrics") if isinstance(status, dict) else None
        if metrics is not None and "actor_grad_norm" in metrics:
            norm = metrics["actor_grad_norm"]
            value = float(norm) if isinstance(norm, (int, float)) or torch.is_tensor(norm) else None
            # DeepSpeed skipped the step (its cached norm is the previous step's) or reported ZeRO-3's -1
            if mb.skipped or (value is not None and value < 0):
                metrics["actor_grad_norm"] = float("nan")
        if mb.skipped_steps is not None:
            run_record.add_metrics({"rlhf_ext/ds_skipped_steps": mb.skipped_steps})
        if guard.mode != "off":
            run_record.add_metrics({"rlhf_ext/guard/incidents": guard.incidents,
                                    "rlhf_ext/guard/max_abs_log_ratio": guard.max_log_ratio})  # fmt: skip
        return status

    return training_step


def make_actor_ppo_train(original, module=None):
    """Count the global steps; reset the per-step maximum of |log-ratio|."""

    @functools.wraps(original)
    def ppo_train(self, kl_ctl):
        guard = _guard_of(self)
        guard.train_calls += 1
        guard.max_log_ratio = 0.0
        return original(self, kl_ctl)

    return ppo_train


__all__ = [
    "CHECKED_TENSORS", "GUARD_EXIT_CODE", "GUARD_MODES", "GuardStop", "POISON_ENV", "bad_rows", "grad_tensors",
    "grads_nonfinite", "guard_mode", "is_guard_stop", "max_abs_log_ratio", "nonfinite_stats", "parse_poison",
    "weights_digest",
]  # fmt: skip
