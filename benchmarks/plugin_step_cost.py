"""What ``--plugin rlhf_ext`` costs per PPO step when it selects the same algorithm as a built-in.

Seam comparison (default). Two child processes, one seam at a time, interleaved:

* **unpatched**: OpenRLHF 0.11.2 imported with the plugin off (no ``RLHF_EXT_PLUGINS``, no
  ``--plugin``), ``--algo.advantage.estimator group_norm``;
* **patched**: the same OpenRLHF with the plugin active (``RLHF_EXT_PLUGINS=rlhf_ext``, so the
  site-packages start-up hook activates it as in every process of a real run),
  ``--algo.advantage.estimator grpo`` (rlhf_ext's estimator through the patched seams).

Both processes build the same inputs from the same seed and run OpenRLHF's real functions (as
patched, or not) on them. Each verifies that it is what it claims (identity checks on every seam;
the run stops when one fails) and the numbers of both sides are compared before any time is
reported (advantages, returns, losses, gradients, rewards; the run stops when they differ). Seams:

==================  ============================================================================
advantages          ``RemoteExperienceMaker.compute_advantages_and_returns`` on the whole rollout
                    batch (patched: rlhf_ext's ``grpo`` plus ``zero_variance_group_frac``)
reward extraction   OpenRLHF's ``SamplesGenerator._process_response_into_experience`` per sample
                    and ``Experience.concat_experiences`` into micro-batches, fed with rlhf_ext's
                    reward file output (patched: its real ``reward_func`` output, extra logs
                    included) or a hand-written file's (unpatched: rewards and scores only)
actor step          ``ActorPPOTrainer.training_step`` on each train micro-batch, forward and
                    backward, with the policy model stubbed by a log-prob tensor (the model's own
                    cost is the same on both sides and would hide the seams): policy loss and its
                    aggregation, KL loss (k3, OpenRLHF's [-10, 10] clamp), the metrics rlhf_ext
                    adds (clip fractions, KL clamp fraction, update counts); its parts also alone:
  policy loss       ``ppo_actor.PolicyLoss`` (patched: rlhf_ext's subclass, configured as the
                    patched ``ActorPPOTrainer.__init__`` does) forward + backward
  KL loss           ``ppo_actor.compute_approx_kl`` + ``aggregate_loss`` forward + backward
                    (patched: inside the plugin's KL settings, clamp fraction included)
KL reward           ``experience_maker.compute_approx_kl`` (k1, no grad) on the rollout batch, as
                    ``make_experience`` runs it when KL goes into the reward (not in the sum: the
                    GRPO recipe puts KL in the loss)
==================  ============================================================================

The sum is advantages + reward extraction + actor step scaled to every train micro-batch of the
step on one rank; "algorithm only" leaves out reward extraction (whose extra cost is the reward
file's per-sample logs, not the estimator). The guard (``--rlhf_ext.guard``) is off in the patched process: its cost is
``benchmarks/guard_cost.py``'s. Without the plugin OpenRLHF cannot import ``flash_attn`` on a
CPU box, so the unpatched process installs only rlhf_ext's flash-attn import fallback (no seam
changes; the identity checks prove it).

Whole step (``--whole-step``): the CPU smoke training run (``rlhf_ext.tours.smoke``'s command: tiny
Qwen2, vLLM, DeepSpeed, Ray, rlhf_ext's math reward) for a few steps, twice, under
``flock /tmp/rlhf_heavy.lock``: the plugin selecting ``grpo`` and the plugin selecting OpenRLHF's
own ``group_norm`` (on CPU OpenRLHF cannot run without the plugin's CPU target, so both sides have
it; only the algorithm seams differ). Per-step times come from the run record's ``timing/*``
metrics (``metrics.jsonl``); the first step (warm-up) is left out of the medians.

    python benchmarks/plugin_step_cost.py                               # smoke shapes, then 512 x 8 x 4096
    python benchmarks/plugin_step_cost.py --shape smoke --reps 20       # only the CPU smoke shapes
    python benchmarks/plugin_step_cost.py --shape smoke --control       # A/A: both sides unpatched (noise floor)
    python benchmarks/plugin_step_cost.py --shape realistic --reps 5 --json out.json
    flock /tmp/rlhf_heavy.lock python benchmarks/plugin_step_cost.py --whole-step --steps 5

Goal (issue #15): <= 1.02x per seam and for the sum.

New losses (``--losses``, issue 22): in one process, OpenRLHF's own ``PolicyLoss`` (the class in
``openrlhf.models.loss``, unpatched: ``ppo``, token-mean) against the plugin's ``PolicyLoss``
configured with each registered loss as ``ActorPPOTrainer.__init__`` configures it
(``--actor.policy_loss_type NAME``, ``--rlhf_ext.step_metrics off``), forward + backward on one
train micro-batch (``train_micro`` x ``tokens``, ragged lengths, OpenRLHF's global counts),
interleaved per repetition; ``openrlhf_ppo_again`` is the A/A row (the noise floor).

    python benchmarks/plugin_step_cost.py --losses new --shape realistic --reps 5
    python benchmarks/plugin_step_cost.py --losses new --shape realistic --reps 15 --clock cpu   # CPU time

Goal (issue #22): <= 1.05x of OpenRLHF's own PPO loss.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()

# prompts x samples x response tokens; micro-batch sizes as OpenRLHF's --rollout.micro_batch_size
# and --train.micro_batch_size; actor_batches: train micro-batches timed per repetition (the sum
# scales them to all of the step's micro-batches).
SHAPES = {
    "tiny": dict(prompts=2, n=4, tokens=8, prompt_tokens=8, rollout_micro=4, train_micro=4, actor_batches=2),
    "smoke": dict(prompts=8, n=4, tokens=16, prompt_tokens=32, rollout_micro=4, train_micro=4, actor_batches=8),
    "realistic": dict(prompts=512, n=8, tokens=4096, prompt_tokens=256, rollout_micro=32, train_micro=8,
                      actor_batches=8),
}
SEAMS = ("advantages", "reward_extraction", "actor_step", "policy_loss", "kl_loss", "kl_reward")
SUM_SEAMS = ("advantages", "reward_extraction", "actor_step")
ALGORITHM_SEAMS = ("advantages", "actor_step")  # what selecting grpo changes, without the reward file's logs
GOAL = 1.02
# grpo's eps is 1e-6 where OpenRLHF's group_norm adds 1e-9: advantages agree to ~1e-5 relative
RTOL, ATOL = 1e-4, 1e-5
PROTOCOL_MARK = "@@plugin_step_cost@@ "
INNER_TARGET_S, MAX_INNER = 0.25, 25  # per repetition and side: short seams are run several times


# ---------------------------------------------------------------------------------------------
# child process: one side
# ---------------------------------------------------------------------------------------------


class SideError(RuntimeError):
    pass


def _ns(**kw):
    from types import SimpleNamespace

    return SimpleNamespace(**kw)


def _step_metrics() -> str:
    """``--step-metrics``, handed to the child processes in the environment."""
    return os.environ.get("RLHF_EXT_BENCH_STEP_METRICS", "all")


def _args(estimator: str, shape: dict):
    """The OpenRLHF ``args`` the seams read (OpenRLHF's defaults, the smoke run's GRPO settings)."""
    return _ns(
        algo=_ns(
            advantage=_ns(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False, is_correction_level="off",
                          is_correction_mode="mask", is_correction_gating="ratio", is_correction_threshold=[0.5, 5.0]),
            kl=_ns(use_loss=True, estimator="k3", init_coef=1e-3, unbiased_gradient=False),
        ),
        rollout=_ns(n_samples_per_prompt=shape["n"], micro_batch_size=shape["rollout_micro"],
                    max_new_tokens=shape["tokens"]),
        reward=_ns(clip_range=None, overlong_buffer_len=None, overlong_penalty_factor=1.0,
                   stop_properly_penalty_coef=None),
        actor=_ns(eps_clip_low_high=[0.2, 0.2], dual_clip=None, loss_agg_mode="token-mean", policy_loss_type="ppo",
                  entropy_coef=None, aux_loss_coef=0.0),
        train=_ns(dynamic_batch_enable=False, micro_batch_size=shape["train_micro"], max_epochs=1),
        data=_ns(max_len=shape["prompt_tokens"] + shape["tokens"]),
        rlhf_ext=_ns(guard="off", run_dir=None, step_metrics=_step_metrics()),
    )


def _inputs(shape: dict, seed: int = 0):
    """Synthetic rollout data: binary rewards (some groups all equal), ragged response lengths."""
    import torch

    g = torch.Generator().manual_seed(seed)
    total = shape["prompts"] * shape["n"]
    T = shape["tokens"]
    lengths = torch.randint(max(1, T // 4), T + 1, (total,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    # p(correct) varies per prompt, so some groups are all 0 or all 1 (zero-variance groups)
    p = torch.rand(shape["prompts"], 1, generator=g).expand(-1, shape["n"]).reshape(-1)
    rewards = (torch.rand(total, generator=g) < p).float()
    logp = -torch.rand(total, T, generator=g) * 2.0
    old = logp + 0.05 * torch.randn(total, T, generator=g)
    base = logp + 0.1 * torch.randn(total, T, generator=g)
    adv = torch.randn(total, T, generator=g) * mask
    order = torch.randperm(total, generator=g)  # OpenRLHF's experiences arrive out of prompt order
    return dict(lengths=lengths, mask=mask, rewards=rewards, logp=logp, old=old, base=base, adv=adv, order=order)


def _reward_outputs(patched: bool, rewards, k: int = 4):
    """The reward file's return value per sample: rlhf_ext's (real ``reward_func``) or a plain one.

    rlhf_ext's file is called on ``k`` distinct correct / wrong answers once (untimed) and its
    outputs are reused for every sample with the same reward.
    """
    import torch

    import importlib.util

    from rlhf_ext.rewards.openrlhf_protocol import scorer_from_env
    from rlhf_ext.rewards.reward_file import reward_file_path

    spec = importlib.util.spec_from_file_location("reward_func", reward_file_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    by_value = {}
    for value, answer in ((1.0, "4"), (0.0, "5")):
        by_value[value] = [module.reward_func([prompt + f"It is \\boxed{{{answer}}}.<|im_end|>"], [prompt], ["4"])
                           for _ in range(k // 2)]
    scorer_from_env().close()  # no grader processes while timing
    outs = []
    for i, r in enumerate(rewards.tolist()):
        choices = by_value[1.0 if r > 0.5 else 0.0]
        out = choices[i % len(choices)]
        if not patched:  # a hand-written reward file: the same numbers, no extra logs
            out = {"rewards": out["rewards"], "scores": out["scores"], "extra_logs": {}}
        outs.append(out)
    return outs


class Side:
    """One process's seams, built from the same inputs on both sides."""

    def __init__(self, side: str, shape_name: str, threads: int):
        import torch

        torch.set_num_threads(threads)
        self.torch = torch
        self.side, self.patched = side, side == "patched"
        self.shape = SHAPES[shape_name]
        self.identity = self._check_identity()
        self.estimator = "grpo" if self.patched else "group_norm"
        self.args = _args(self.estimator, self.shape)
        self.data = _inputs(self.shape)
        self._build()

    # -- identity: the unpatched side really is OpenRLHF's code, the patched side really is rlhf_ext's --

    def _check_identity(self) -> dict:
        plugin_env = os.environ.get("RLHF_EXT_PLUGINS", "")
        if not self.patched:
            if plugin_env or "rlhf_ext.patches.activation.startup" in sys.modules:
                raise SideError(f"unpatched side: the plugin was requested (RLHF_EXT_PLUGINS={plugin_env!r})")
            # OpenRLHF imports flash_attn at module level; a GPU box has it, this one gets the import fallback
            from rlhf_ext.patches import flash_attn_fallback

            flash_attn_fallback.install()
        from openrlhf.models import loss as oloss
        from openrlhf.models import utils as outils
        from openrlhf.trainer.ppo_utils import experience_maker as em
        from openrlhf.trainer.ppo_utils import samples_generator as sg
        from openrlhf.trainer.ray import ppo_actor as pa

        self.em, self.pa, self.sg, self.oloss, self.outils = em, pa, sg, oloss, outils
        seams = {
            "experience_maker.compute_approx_kl": (em.compute_approx_kl, outils.compute_approx_kl),
            "ppo_actor.compute_approx_kl": (pa.compute_approx_kl, outils.compute_approx_kl),
            "ppo_actor.PolicyLoss": (pa.PolicyLoss, oloss.PolicyLoss),
            "RemoteExperienceMaker.compute_advantages_and_returns": (
                em.RemoteExperienceMaker.__dict__["compute_advantages_and_returns"], None),
            "ActorPPOTrainer.training_step": (pa.ActorPPOTrainer.__dict__["training_step"], None),
            "ActorPPOTrainer.__init__": (pa.ActorPPOTrainer.__dict__["__init__"], None),
        }
        mark = "__rlhf_ext_patch__"
        found = {}
        for name, (obj, original) in seams.items():
            is_rlhf_ext = getattr(obj, mark, None) is not None or getattr(obj, "__module__", "").startswith("rlhf_ext")
            if original is not None and not self.patched and obj is not original:
                raise SideError(f"unpatched side: {name} is not OpenRLHF's own object ({obj!r})")
            if is_rlhf_ext != self.patched:
                raise SideError(f"{self.side} side: {name} {'is' if is_rlhf_ext else 'is not'} rlhf_ext's patch")
            found[name] = getattr(obj, mark, None) or getattr(obj, "__qualname__", repr(obj))
        if self.patched:
            from rlhf_ext.patches import is_active
            from rlhf_ext.patches.openrlhf import compat

            if not is_active("rlhf_ext"):
                raise SideError("patched side: the rlhf_ext plugin is not active in this process")
            if pa.PolicyLoss.__mro__[1] is not oloss.PolicyLoss:
                raise SideError("patched side: ppo_actor.PolicyLoss does not extend OpenRLHF's PolicyLoss")
            if compat.original(em, "compute_approx_kl") is not outils.compute_approx_kl:
                raise SideError("patched side: the KL patch does not wrap OpenRLHF's compute_approx_kl")
            from rlhf_ext.algorithms import available_advantages

            if "grpo" not in available_advantages():
                raise SideError("patched side: rlhf_ext's grpo estimator is not registered")
        return found

    # -- inputs --

    def _experience(self, **kw):
        from openrlhf.trainer.ppo_utils.experience import Experience

        return Experience(**kw)

    def _build(self):
        torch, d, s = self.torch, self.data, self.shape
        total = s["prompts"] * s["n"]
        order = d["order"].tolist()
        # rollout micro-batches (experience maker), in arrival order
        self.rollout_batches = [order[i: i + s["rollout_micro"]] for i in range(0, total, s["rollout_micro"])]
        self.kl_zero = [torch.zeros(len(b), s["tokens"]) for b in self.rollout_batches]
        self.masks = [d["mask"][b] for b in self.rollout_batches]
        # train micro-batches (actor), the first actor_batches of the step
        n_train = min(s["actor_batches"], total // s["train_micro"])
        self.train_batches = [order[i * s["train_micro"]: (i + 1) * s["train_micro"]] for i in range(n_train)]
        self.train_batches_per_step = total // s["train_micro"]
        self.params = [torch.nn.Parameter(d["logp"][b].clone()) for b in self.train_batches]
        self.reward_outputs = _reward_outputs(self.patched, d["rewards"])
        self.responses = self._responses()
        self.maker = self._maker()
        self.trainer = self._trainer()

    def _maker(self):
        em = self.em
        maker = em.RemoteExperienceMaker.__new__(em.RemoteExperienceMaker)
        maker.advantage_estimator = self.estimator
        maker.kl_ctl = _ns(value=self.args.algo.kl.init_coef)
        maker.strategy = _ns(args=self.args)
        maker.args = self.args
        return maker

    def _responses(self):
        s, d = self.shape, self.data
        prompt = list(range(5, 5 + s["prompt_tokens"]))
        out = []
        for i, length in enumerate(d["lengths"].tolist()):
            r = self.reward_outputs[i]
            response = {
                "prompt": "p", "label": "4", "images": None, "mm_train_inputs": None,
                "observation_tokens": prompt + [7] * length, "action_ranges": [(len(prompt), len(prompt) + length)],
                "rollout_log_probs": None, "truncated": False, "reward": None, "scores": None, "extra_logs": {},
            }
            # SingleTurnAgentExecutor's handling of the reward file's dict (openrlhf/utils/agent.py)
            score = r.get("scores")
            response.update(reward=r.get("rewards"), scores=score if score is not None else r.get("rewards"),
                            extra_logs=r.get("extra_logs") or {})
            out.append(response)
        return out

    def _trainer(self):
        torch, pa = self.torch, self.pa
        side = self

        class StubActor(torch.nn.Module):
            """The policy model replaced by this micro-batch's log-prob tensor (a leaf with a gradient)."""

            current = 0

            def forward(self, sequences, action_mask, **kwargs):
                return side.params[self.current], _ns(aux_loss=None, entropy=None)

        class Strategy:
            ring_attn_group = None
            accumulated_gradient = 1
            args = self.args

            def backward(self, loss, model, optimizer, **kwargs):
                loss.backward()

            def optimizer_step(self, optimizer, model, scheduler, name="model", **kwargs):
                p = side.params[model.current]
                side.last_grads.append(p.grad)
                p.grad = None

            def get_grad_norm(self, model):
                return 0.0

            def all_reduce(self, data, op="mean"):
                return data

        trainer = pa.ActorPPOTrainer.__new__(pa.ActorPPOTrainer)
        trainer.strategy, trainer.args = Strategy(), self.args
        trainer.actor, trainer.ema_model, trainer.aux_loss = StubActor(), None, False
        trainer.actor_scheduler = _ns(get_last_lr=lambda: [1e-6])
        trainer.actor_optim, trainer.replay_buffer = None, None
        a = self.args
        trainer.actor_loss_fn = pa.PolicyLoss(
            clip_eps_low=a.actor.eps_clip_low_high[0], clip_eps_high=a.actor.eps_clip_low_high[1],
            dual_clip=a.actor.dual_clip, token_level_loss=a.actor.loss_agg_mode == "token-mean",
            policy_loss_type=a.actor.policy_loss_type,
            is_correction_level=a.algo.advantage.is_correction_level,
        )
        if self.patched:  # what the patched ActorPPOTrainer.__init__ adds
            from rlhf_ext.patches.openrlhf.policy_loss import configure_from_args

            configure_from_args(trainer.actor_loss_fn, self.args)
        self.last_grads = []
        return trainer

    def _train_experiences(self):
        d, torch = self.data, self.torch
        exps = []
        for b in self.train_batches:
            mask = d["mask"][b]
            exps.append(self._experience(
                sequences=torch.zeros(len(b), 1, dtype=torch.long), attention_mask=None, action_mask=mask,
                action_log_probs=d["old"][b], base_action_log_probs=d["base"][b], advantages=d["adv"][b],
                rollout_log_probs=None, info={}, index=list(b),
            ))
        return exps

    def _loss_batch_info(self, mask):
        # OpenRLHF's per-optimizer-step global counts (one rank, one micro-batch per step here)
        return {"dp_size": 1, "batch_num_tokens": float(mask.sum()), "global_batch_size": float(mask.shape[0])}

    # -- seams: prepare (untimed) -> run (timed) -> outputs (for the numerical check) --

    def prepare(self, seam):
        torch, d = self.torch, self.data
        if seam == "advantages":
            return [self._experience(index=list(b), rewards=d["rewards"][b].clone(), action_mask=m, kl=k,
                                     info={}, response_length=m.sum(-1), values=None)
                    for b, m, k in zip(self.rollout_batches, self.masks, self.kl_zero)]
        if seam == "actor_step":
            self.last_grads = []
            return self._train_experiences()
        if seam in ("policy_loss", "kl_loss"):
            return [(p, d["old"][b], d["base"][b], d["adv"][b], d["mask"][b]) for p, b in zip(self.params,
                                                                                            self.train_batches)]
        if seam == "kl_reward":
            return [(d["logp"][b], d["base"][b], m) for b, m in zip(self.rollout_batches, self.masks)]
        return None

    def run(self, seam, prepared):
        torch = self.torch
        if seam == "advantages":
            return self.maker.compute_advantages_and_returns(prepared)
        if seam == "reward_extraction":
            # a bare object for ``self`` (the method reads nothing from it; the patched one looks in its __dict__)
            generator = argparse.Namespace()
            exps = [self.sg.SamplesGenerator._process_response_into_experience(generator, r, max_len=10**9)
                    for r in self.responses]
            return [self.em.Experience.concat_experiences([exps[i] for i in b], 0) for b in self.rollout_batches]
        if seam == "actor_step":
            statuses = []
            for step, exp in enumerate(prepared):
                self.trainer.actor.current = step
                statuses.append(self.trainer.training_step(exp, self.args.algo.kl.init_coef, step,
                                                           self._loss_batch_info(exp.action_mask)))
            return statuses
        if seam == "policy_loss":
            out = []
            for p, old, _base, adv, mask in prepared:
                loss, clip_ratio, ppo_kl, _, _ = self.trainer.actor_loss_fn(
                    p, old, adv, action_mask=mask, rollout_log_probs=None, **self._loss_batch_info(mask))
                loss.backward()
                out.append((loss.detach(), p.grad))
                p.grad = None
            return out
        if seam == "kl_loss":
            return [self._kl_loss(*item) for item in prepared]
        if seam == "kl_reward":
            return [self._kl_reward(*item) for item in prepared]
        raise SideError(f"unknown seam {seam!r}")

    def _kl_loss(self, p, old, base, adv, mask):
        oloss, pa = self.oloss, self.pa
        info = self._loss_batch_info(mask)

        def body():
            kl = pa.compute_approx_kl(p, base, log_probs_old=old, kl_estimator="k3", unbiased_gradient=False)
            return oloss.aggregate_loss(kl, mask, **info)

        if self.patched:
            from rlhf_ext.patches.openrlhf.kl import clipped_fraction, kl_settings

            with kl_settings(self.args) as ctx:
                kl_loss = body()
            if ctx.flags:  # (none with --step-metrics off)
                clipped_fraction(ctx.flags[-1], mask, per_sample=False)
        else:
            kl_loss = body()
        kl_loss.backward()
        grad, p.grad = p.grad, None
        return kl_loss.detach(), grad

    def _kl_reward(self, logp, base, mask):
        em = self.em
        if self.patched:
            from rlhf_ext.patches.openrlhf.kl import clipped_fraction, kl_settings

            with kl_settings(self.args) as ctx:
                kl = em.compute_approx_kl(logp, base, kl_estimator="k1")
            if ctx.flags:
                clipped_fraction(ctx.flags[-1], mask, per_sample=True)
            return kl
        return em.compute_approx_kl(logp, base, kl_estimator="k1")

    def outputs(self, seam, result) -> dict:
        """Tensors both sides must agree on."""
        torch = self.torch
        if seam == "advantages":
            out = {"advantages": torch.cat([e.advantages.flatten() for e in result]),
                   "returns": torch.cat([e.returns.flatten() for e in result]),
                   "group_reward_std": torch.cat([e.info["group_reward_std"] for e in result])}
            # (with --step-metrics off the metric is not computed; the patch marks still prove the path)
            if self.patched and _step_metrics() != "off" and not all("zero_variance_group_frac" in e.info for e in result):
                raise SideError("patched side: advantages did not go through rlhf_ext (no zero_variance_group_frac)")
            return out
        if seam == "reward_extraction":
            return {"rewards": torch.cat([e.rewards for e in result]), "scores": torch.cat([e.scores for e in result]),
                    "action_mask": torch.cat([e.action_mask.flatten() for e in result]).float()}
        if seam == "actor_step":
            if self.patched and _step_metrics() != "off" and not all("clip_frac_low" in s["metrics"] for s in result):
                raise SideError("patched side: the actor step did not go through rlhf_ext's loss (no clip_frac_low)")
            return {"policy_loss": torch.stack([s["metrics"]["policy_loss"].float() for s in result]),
                    "kl": torch.stack([s["metrics"]["kl"].float() for s in result]),
                    "grads": torch.cat([g.flatten() for g in self.last_grads])}
        if seam in ("policy_loss", "kl_loss"):
            return {"loss": torch.stack([loss for loss, _ in result]),
                    "grads": torch.cat([g.flatten() for _, g in result])}
        if seam == "kl_reward":
            return {"kl": torch.cat([k.flatten() for k in result])}
        return {}


def child_main(side: str, shape: str, threads: int, outdir: str, role: str = "") -> int:
    """Serve ``warm SEAM`` / ``run SEAM`` / ``quit`` lines from the parent; answer in JSON lines."""
    # The answers go through a private copy of stdout; whatever the libraries print goes to stderr.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import torch

    def send(obj):
        proto.write(PROTOCOL_MARK + json.dumps(obj) + "\n")
        proto.flush()

    try:
        s = Side(side, shape, threads)
    except SideError as exc:
        send({"error": str(exc)})
        return 2
    send({"ready": True, "identity": s.identity, "threads": torch.get_num_threads(),
          "plugins": os.environ.get("RLHF_EXT_PLUGINS", "")})
    for line in sys.stdin:
        cmd, _, seam = line.strip().partition(" ")
        if cmd == "quit":
            return 0
        try:
            prepared = s.prepare(seam)
            t0 = time.perf_counter()
            result = s.run(seam, prepared)
            dt = time.perf_counter() - t0
            if cmd == "warm":
                torch.save(s.outputs(seam, result), os.path.join(outdir, f"{role or side}_{seam}.pt"))
            del result, prepared
            send({"seam": seam, "seconds": dt})
        except SideError as exc:
            send({"error": str(exc)})
            return 2
    return 0


# ---------------------------------------------------------------------------------------------
# parent: interleave the two sides, compare numbers, report
# ---------------------------------------------------------------------------------------------


def _child_env(side: str) -> dict:
    env = dict(os.environ)
    for key in ("RLHF_EXT_PLUGINS", "RLHF_EXT_DEVICE"):  # the CPU retarget is not a seam: off on both sides
        env.pop(key, None)
    env["RLHF_EXT_QUIET"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    if side == "patched":
        env["RLHF_EXT_PLUGINS"] = "rlhf_ext"  # the start-up hook activates it, as in a Ray actor
    return env


class Child:
    def __init__(self, side, shape, threads, outdir, role=None):
        self.side = side
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), "--child", side, "--shape", shape, "--threads", str(threads),
             "--outdir", outdir, "--role", role or side],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_child_env(side),
        )

    def read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"error: the {self.side} process died (exit {self.proc.wait()})")
            if line.startswith(PROTOCOL_MARK):
                break
        msg = json.loads(line[len(PROTOCOL_MARK):])
        if "error" in msg:
            raise SystemExit(f"error: {msg['error']}")
        return msg

    def ask(self, cmd: str, seam: str) -> float:  # noqa: D102
        self.proc.stdin.write(f"{cmd} {seam}\n")
        self.proc.stdin.flush()
        return self.read()["seconds"]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def compare_outputs(outdir: str, seam: str) -> dict:
    """Max |difference| per output tensor; raises SystemExit if the sides disagree."""
    import torch

    a = torch.load(os.path.join(outdir, f"unpatched_{seam}.pt"))
    b = torch.load(os.path.join(outdir, f"patched_{seam}.pt"))
    if set(a) != set(b):
        raise SystemExit(f"error: {seam}: the sides returned different outputs ({sorted(a)} vs {sorted(b)})")
    diffs = {}
    for key in a:
        x, y = a[key].double(), b[key].double()
        if x.shape != y.shape:
            raise SystemExit(f"error: {seam}/{key}: shapes differ {tuple(x.shape)} vs {tuple(y.shape)}")
        if not torch.allclose(x, y, rtol=RTOL, atol=ATOL):
            worst = (x - y).abs().max().item()
            raise SystemExit(f"error: {seam}/{key}: the sides disagree (max |diff| {worst:.3g}); not apples to apples")
        diffs[key] = (x - y).abs().max().item() if x.numel() else 0.0
    return diffs


def compare_seams(shape: str, reps: int, threads: int, seams=SEAMS, progress: bool = True,
                  control: bool = False) -> dict:
    """Run both sides on ``shape`` and return the report (times in seconds, ratios, numerics).

    Each repetition runs a seam ``inner`` times per side, alternating sides, where ``inner`` makes
    a short seam add up to about ``INNER_TARGET_S`` (a millisecond seam gets many samples, a
    multi-second one a single sample per repetition). ``control``: an A/A run, both processes
    unpatched OpenRLHF with group_norm (the noise floor of the comparison on this machine).
    """
    sc = SHAPES[shape]
    with tempfile.TemporaryDirectory(prefix="plugin_step_cost_") as outdir:
        load_before = os.getloadavg()
        children = {role: Child("unpatched" if control else role, shape, threads, outdir, role)
                    for role in ("unpatched", "patched")}
        try:
            ready = {side: c.read() for side, c in children.items()}
            times = {seam: {"unpatched": [], "patched": []} for seam in seams}
            numerics, inner = {}, {}
            for seam in seams:  # warm-up run, which also writes the outputs for the check
                warm = max(children[side].ask("warm", seam) for side in ("unpatched", "patched"))
                inner[seam] = max(1, min(MAX_INNER, int(INNER_TARGET_S / max(warm, 1e-6))))
                numerics[seam] = compare_outputs(outdir, seam)
            total = reps * sum(inner.values())
            done = 0
            for rep in range(reps):
                for seam in seams:
                    for i in range(inner[seam]):
                        order = ("unpatched", "patched") if (rep + i) % 2 == 0 else ("patched", "unpatched")
                        for side in order:
                            times[seam][side].append(children[side].ask("run", seam))
                        done += 1
                        if progress and done % 10 == 0 or done == total:
                            _progress(f"{shape}: repetition {rep + 1}/{reps}", done, total)
            if progress:
                sys.stderr.write("\n")
        finally:
            for c in children.values():
                c.close()
        load_after = os.getloadavg()
    actor_scale = (sc["prompts"] * sc["n"] // sc["train_micro"]) / min(
        sc["actor_batches"], sc["prompts"] * sc["n"] // sc["train_micro"])
    rows = {}
    for seam in seams:
        u, p = statistics.median(times[seam]["unpatched"]), statistics.median(times[seam]["patched"])
        rows[seam] = {"unpatched_s": u, "patched_s": p, "ratio": p / u if u > 0 else float("nan"),
                      "samples": len(times[seam]["patched"]), "max_abs_diff": numerics[seam]}
    report = {"shape": shape, **sc, "reps": reps, "control": control, "torch_threads": ready["patched"]["threads"],
              "identity": {side: r["identity"] for side, r in ready.items()}, "seams": rows,
              "load_avg_before": [round(x, 2) for x in load_before],
              "load_avg_after": [round(x, 2) for x in load_after], "cpus": os.cpu_count()}
    def total_of(side, names):
        return sum(rows[s][f"{side}_s"] * (actor_scale if s == "actor_step" else 1.0) for s in names)

    for key, names in (("sum", SUM_SEAMS), ("sum_algorithm", ALGORITHM_SEAMS)):
        if all(s in rows for s in names):
            u, p = total_of("unpatched", names), total_of("patched", names)
            report[key] = {"unpatched_s": u, "patched_s": p, "ratio": p / u, "actor_scale": actor_scale}
    return report


def _progress(label: str, done: int, total: int) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    sys.stderr.flush()


def print_report(report: dict) -> None:
    sc = report
    print(f"\n== {sc['shape']}: {sc['prompts']} prompts x {sc['n']} samples x {sc['tokens']} tokens "
          f"(rollout micro-batch {sc['rollout_micro']}, train micro-batch {sc['train_micro']}); "
          f"medians, {sc['reps']} interleaved repetitions, torch threads {sc['torch_threads']}")
    right = "A/A: group_norm" if sc.get("control") else "plugin grpo"
    print(f"   {'seam':<20}{'OpenRLHF group_norm':>21}{right:>16}{'ratio':>9}{'runs':>6}   numerics (max |diff|)")
    for seam, row in sc["seams"].items():
        flag = "" if row["ratio"] <= GOAL else "  > goal"
        diff = max(row["max_abs_diff"].values()) if row["max_abs_diff"] else 0.0
        print(f"   {seam:<20}{_fmt(row['unpatched_s']):>21}{_fmt(row['patched_s']):>16}{row['ratio']:>8.3f}x"
              f"{row['samples']:>6}   equal ({diff:.1e}){flag}")
    for key, label, what in (("sum", "sum per step", "advantages + reward extraction + actor step"),
                             ("sum_algorithm", "  algorithm only", "advantages + actor step")):
        if key in sc:
            s = sc[key]
            print(f"   {label:<20}{_fmt(s['unpatched_s']):>21}{_fmt(s['patched_s']):>16}{s['ratio']:>8.3f}x"
                  f"   ({what} x {s['actor_scale']:g})")
    print(f"   machine: {sc['cpus']} CPUs; load average {sc['load_avg_before'][0]:.2f} -> "
          f"{sc['load_avg_after'][0]:.2f} "
          f"(1 min), {sc['load_avg_after'][1]:.2f} (5 min); identity checks passed on both sides"
          + ("; A/A CONTROL: both sides unpatched" if sc.get("control") else ""))


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.3f} s"


# ---------------------------------------------------------------------------------------------
# whole step: two short CPU smoke trainings
# ---------------------------------------------------------------------------------------------


def _smoke_module():
    from rlhf_ext.tours import smoke

    return smoke


def whole_step(workdir: Path, steps: int, timeout: float, rounds: int = 1) -> dict:
    """Train ``steps`` steps with each estimator, ``rounds`` times (alternating which goes first)."""
    smoke = _smoke_module()
    from rlhf_ext.tours.tiny_task import build_tiny_task

    workdir = workdir.resolve()
    task = workdir / "task"
    if not (task / "task.json").exists():
        print("building the tiny task", flush=True)
        build_tiny_task(task)
    results = {name: {"wall_s": [], "steps": []} for name in ("group_norm", "grpo")}
    load_before = os.getloadavg()
    for r in range(rounds):
        order = ("group_norm", "grpo") if r % 2 == 0 else ("grpo", "group_norm")
        for name in order:
            out = workdir / f"ckpt_{name}"
            cmd = smoke.train_command(model=task / "model", prompts=task / "train.jsonl", output=out,
                                      estimator="grpo", steps=steps)
            i = cmd.index("--algo.advantage.estimator")
            cmd[i + 1] = name  # only the estimator differs: OpenRLHF's built-in or rlhf_ext's
            record = smoke.run_record_dir(out)
            if record.exists():
                import shutil

                shutil.rmtree(record)
            print(f"round {r + 1}/{rounds}: training {name} ({steps} steps)...", flush=True)
            t0 = time.time()
            log = workdir / f"train_{name}_{r + 1}.log"
            rc = smoke.run_training(cmd, log, timeout=timeout, echo=False, env=smoke.train_env())
            if rc != 0:
                raise SystemExit(f"error: the {name} run failed (exit {rc}); see {log}")
            timings = _step_timings(record / "metrics.jsonl")
            if len(timings) != steps:
                raise SystemExit(f"error: the {name} run recorded {len(timings)} steps, expected {steps}")
            results[name]["wall_s"].append(time.time() - t0)
            results[name]["steps"].extend(timings[1:])  # the first step of a run is warm-up
    load_after = os.getloadavg()
    return {"steps": steps, "rounds": rounds, "runs": results, "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in load_after], "cpus": os.cpu_count()}


def _step_timings(path: Path) -> list:
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            metrics = rec.get("metrics", rec)
            rows.append({k: v for k, v in metrics.items() if k.startswith("timing/") and isinstance(v, (int, float))})
    return rows


def print_whole_step(report: dict) -> None:
    runs = report["runs"]
    keys = sorted(set().union(*[set(s) for r in runs.values() for s in r["steps"]]))
    n = len(runs["grpo"]["steps"])
    print(f"\n== whole step, CPU smoke run: {report['rounds']} run(s) of {report['steps']} steps per side, "
          f"median over {n} steps per side (each run's first step left out)")
    print(f"   {'timing metric (s)':<28}{'plugin + group_norm':>20}{'plugin + grpo':>15}{'ratio':>9}")
    for key in keys:
        vals = {}
        for name, run in runs.items():
            xs = [s[key] for s in run["steps"] if key in s]
            vals[name] = statistics.median(xs) if xs else float("nan")
        ratio = vals["grpo"] / vals["group_norm"] if vals["group_norm"] else float("nan")
        print(f"   {key:<28}{vals['group_norm']:>20.3f}{vals['grpo']:>15.3f}{ratio:>8.3f}x")
    walls = {name: ", ".join(f"{w:.0f}" for w in run["wall_s"]) for name, run in runs.items()}
    print(f"   wall clock per run (s, start-up included): group_norm {walls['group_norm']}; grpo {walls['grpo']}")
    print(f"   machine: {report['cpus']} CPUs; load average {report['load_avg_before'][0]:.2f} -> "
          f"{report['load_avg_after'][0]:.2f} (1 min)")


NEW_LOSSES = ("cispo", "sapo", "gmpo", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "luspo", "vespo",
              "dro", "gpg", "bypass_mode")  # the last three: issue 42
LOSS_GOAL = 1.05
# issue 42's staleness objectives on OpenRLHF's ppo (--rlhf_ext.decoupled_loss, --rlhf_ext.m2po_threshold): rows
# "<loss>+decoupled" and "<loss>+m2po", vLLM's log-probs 0.1-noisy around the old ones
STALENESS_ROWS = {"decoupled": dict(decoupled_loss=True), "m2po": dict(m2po_threshold=0.005)}


def compare_losses(shape_name: str, reps: int, names, threads: int = 1, clock: str = "wall") -> dict:
    """Median time of forward + backward per loss, and its ratio to OpenRLHF's own PPO loss.

    ``clock``: ``wall`` (``time.perf_counter``) or ``cpu`` (``time.process_time``: the process's CPU
    time, which leaves out the time the process waited for a core on a shared machine)."""
    import torch

    now = time.process_time if clock == "cpu" else time.perf_counter

    from rlhf_ext.patches import activate

    torch.set_num_threads(threads)
    activate(["rlhf_ext"], role="bench")
    from openrlhf.models.loss import PolicyLoss as OpenRLHFPolicyLoss
    from openrlhf.trainer.ray import ppo_actor

    from rlhf_ext.patches.openrlhf.policy_loss import configure_from_args

    shape = SHAPES[shape_name]
    B, T = shape["train_micro"], shape["tokens"]
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(max(1, T // 4), T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logp = -torch.rand(B, T, generator=g) * 2.0
    old = logp + 0.05 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, T) * mask
    rollout = (old + 0.1 * torch.randn(B, T, generator=g)).clamp(max=0.0)
    info = {"dp_size": 1, "batch_num_tokens": mask.sum().float(), "global_batch_size": torch.tensor(float(B))}

    def make(name):
        if name in ("openrlhf_ppo", "openrlhf_ppo_again"):
            return OpenRLHFPolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, policy_loss_type="ppo")
        name, _, objective = name.partition("+")
        loss = ppo_actor.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, policy_loss_type=name)
        args = _ns(actor=_ns(loss_agg_mode="token-mean", policy_loss_type=name, loss_agg_max_len=None,
                             policy_loss_option=["seed=0"] if name == "clip_cov" else None),
                   rlhf_ext=_ns(step_metrics="off", **STALENESS_ROWS.get(objective, {})))
        configure_from_args(loss, args)
        return loss

    def once(fn):
        lp = logp.clone().requires_grad_()
        out = fn(lp, old, adv, action_mask=mask, rollout_log_probs=rollout, **info)[0]
        out.backward()
        if not torch.isfinite(lp.grad).all():
            raise SideError("non-finite gradient")

    rows = ["openrlhf_ppo_again", *names]
    fns = {n: make(n) for n in ["openrlhf_ppo", *rows]}
    inner = {}
    for n, fn in fns.items():  # warm-up; the number of runs per timing
        once(fn)
        t0 = now()
        once(fn)
        inner[n] = max(1, min(MAX_INNER, int(INNER_TARGET_S / max(now() - t0, 1e-6))))
    k = min(inner.values())
    times = {n: [] for n in fns}
    for rep in range(reps):
        for n in rows:
            for side in ("openrlhf_ppo", n) if rep % 2 == 0 else (n, "openrlhf_ppo"):
                t0 = now()
                for _ in range(k):
                    once(fns[side])
                times[side].append((now() - t0) / k)
        _progress(f"losses {shape_name}", rep + 1, reps)
    base = statistics.median(times["openrlhf_ppo"])
    return {"shape": shape_name, "batch": [B, T], "reps": reps, "runs": k, "baseline_s": base, "clock": clock,
            "losses": {n: {"median_s": statistics.median(times[n]), "ratio": statistics.median(times[n]) / base}
                       for n in rows}}


def print_losses(report: dict) -> None:
    B, T = report["batch"]
    print(f"\npolicy loss forward+backward, {B} x {T} tokens (shape {report['shape']}), {report['reps']} reps x "
          f"{report['runs']} runs, {report.get('clock', 'wall')} time; OpenRLHF's own ppo: {_fmt(report['baseline_s'])}")
    for name, row in report["losses"].items():
        flag = "" if row["ratio"] <= LOSS_GOAL else f"  (> {LOSS_GOAL}x)"
        print(f"  {name:<20} {_fmt(row['median_s']):>10}  x{row['ratio']:.3f}{flag}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all",
                        help="input shapes: smoke (the CPU smoke run's), realistic (512 x 8 x 4096), tiny, or "
                             "all = smoke then realistic (default)")
    parser.add_argument("--reps", type=int, default=None,
                        help="interleaved repetitions (default: 10 smoke/tiny, 5 realistic); in each, a seam "
                             f"runs as many times as fit in {INNER_TARGET_S} s (at most {MAX_INNER})")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in each side's process (default 1: the two sides run one at a time; "
                             "steadier on a shared box)")
    parser.add_argument("--seams", default=",".join(SEAMS), help=f"comma list from {', '.join(SEAMS)}")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    parser.add_argument("--control", action="store_true",
                        help="A/A run: both processes unpatched OpenRLHF (group_norm); shows the noise floor")
    parser.add_argument("--whole-step", action="store_true",
                        help="instead: two short CPU smoke trainings (run it under flock /tmp/rlhf_heavy.lock)")
    parser.add_argument("--steps", type=int, default=5, help="--whole-step: training steps per run (default 5)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="--whole-step: runs per side, alternating which side goes first (default 1)")
    parser.add_argument("--workdir", type=Path, default=Path("runs/plugin_step_cost"),
                        help="--whole-step: where the task, logs and run records go")
    parser.add_argument("--timeout", type=float, default=1200, help="--whole-step: seconds per training run")
    parser.add_argument("--step-metrics", choices=["all", "off"], default="all",
                        help="the patched side's --rlhf_ext.step_metrics (off: only OpenRLHF's own work in the "
                             "loss, KL and advantage seams; default all)")
    parser.add_argument("--losses", default=None, metavar="LIST",
                        help="instead: each registered loss (comma list, or 'new' = issue 22's nine) against "
                             "OpenRLHF's own PPO loss, forward + backward in one process, step metrics off")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="--losses: time with the wall clock (default) or the process's CPU time (steadier on "
                             "a shared machine: time spent waiting for a core is left out)")
    parser.add_argument("--child", choices=["patched", "unpatched"], help=argparse.SUPPRESS)
    parser.add_argument("--outdir", help=argparse.SUPPRESS)
    parser.add_argument("--role", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.child:
        os.environ["RLHF_EXT_BENCH_STEP_METRICS"] = args.step_metrics

    if args.child:
        return child_main(args.child, args.shape, args.threads, args.outdir, args.role or "")
    if args.losses:
        names = list(NEW_LOSSES) if args.losses == "new" else [n.strip() for n in args.losses.split(",") if n.strip()]
        shapes = ["smoke", "realistic"] if args.shape == "all" else [args.shape]
        reports = []
        for shape in shapes:
            report = compare_losses(shape, args.reps or (5 if shape == "realistic" else 10), names, args.threads,
                                    args.clock)
            print_losses(report)
            reports.append(report)
    elif args.whole_step:
        if args.steps < 2:
            parser.error("--steps must be >= 2 (the first step is warm-up)")
        report = whole_step(args.workdir, args.steps, args.timeout, args.rounds)
        print_whole_step(report)
        reports = [report]
    else:
        seams = [s.strip() for s in args.seams.split(",") if s.strip()]
        unknown = [s for s in seams if s not in SEAMS]
        if unknown:
            parser.error(f"unknown seam(s) {', '.join(unknown)}; choose from {', '.join(SEAMS)}")
        shapes = ["smoke", "realistic"] if args.shape == "all" else [args.shape]
        reports = []
        for shape in shapes:
            reps = args.reps or (5 if shape == "realistic" else 10)
            report = compare_seams(shape, reps, args.threads, seams, control=args.control)
            print_report(report)
            reports.append(report)
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
