"""One short check of rlhf_ext on an accelerator: every registered algorithm on device tensors against
the CPU, and what the guard and the step metrics cost a real bf16 training step there.

    python benchmarks/device_check.py                  # CUDA, realistic shapes (scripts/gpu/device_check.sh)
    python benchmarks/device_check.py --cpu            # small shapes on the CPU (CI runs this)
    python benchmarks/device_check.py --json out.json --budget 450

Needs PyTorch and transformers only (no vLLM, Ray, DeepSpeed or OpenRLHF, no network).

Sections, each under its own time limit, each result written to the JSON file as soon as it exists
(a run cut short still leaves what it measured):

* ``algorithms``: every name in the registries -- advantage estimators (``scores`` [P, N]),
  policy losses (loss, metrics and the gradient of the token-mean loss with respect to the
  log-probs), loss aggregation modes, KL estimators, and the rollout-correction modes when
  :mod:`rlhf_ext.algorithms` has them (``IS_LEVELS`` / ``REJECTION_OPTIONS`` /
  ``rollout_correction``) -- computed on the device from the same inputs as on the CPU, with
  bf16 and fp32 log-probs, and compared: ``max_err`` is the largest difference relative to the
  reference's magnitude (element-wise tensors) or to the same reduction over absolute values
  (scalars), NaN positions must match. Realistic shapes: 512 prompts x 8 samples x 4096 tokens.
* ``step``: a Qwen2-shaped model from a config (random weights; on CUDA about 0.5B parameters,
  Qwen2.5-0.5B's shape, bf16, AdamW), one training step = forward, log-probs, rlhf_ext's PPO loss,
  backward, optimizer step, run in four variants alternating: plain, with the non-finite guard
  (:class:`rlhf_ext.patches.openrlhf.guard.Guard`: its checks before backward and its gradient check
  at the step boundary), with the step metrics rlhf_ext adds (split clip fractions, KL clamp
  fraction, the update counter's signal, read out as OpenRLHF logs them), and both. Per variant:
  median step time and the host synchronizations it adds -- counted by wrapping the calls that
  synchronize (``Tensor.item`` / ``__bool__`` / ``__float__`` / ``__int__`` / ``tolist`` /
  ``cpu`` / ``numpy``, ``torch.cuda.synchronize``) on device tensors, and on CUDA also with
  ``torch.cuda.set_sync_debug_mode("warn")``'s own count. Goal (issue 27): guard and metrics on
  <= 1.02x the plain step.

Prints one summary table at the end. Exit status 0 when every comparison passed and every section
finished; 1 otherwise (the JSON says what failed).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import platform
import signal
import statistics
import sys
import time
import traceback
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

HEAVY_MODULES = ("openrlhf", "vllm", "ray", "deepspeed")
# Relative error allowed between device and CPU, by log-prob dtype: fp32 reductions may be ordered
# differently; bf16 results carry bf16 rounding (8 bits of mantissa) on both sides.
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}
FRACTION_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-3}  # token fractions: a boundary token may flip


class SectionTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float, what: str):
    """Raise :class:`SectionTimeout` in this (main) thread after ``seconds``; device work is queued
    asynchronously, so the alarm lands at the next Python line."""
    if seconds <= 0:
        raise SectionTimeout(f"{what}: no time left in the budget")

    def on_alarm(signum, frame):
        raise SectionTimeout(f"{what} ran past its {seconds:.0f} s limit")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Report:
    """The JSON report, rewritten (atomically) after every result."""

    def __init__(self, path):
        self.path = path
        self.data = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "complete": False,
                     "sections": {}, "errors": []}

    def save(self):
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)

    def section(self, name):
        return self.data["sections"].setdefault(name, {"status": "running", "results": []})

    def add(self, name, result):
        self.section(name)["results"].append(result)
        self.save()

    def error(self, where, exc):
        self.data["errors"].append({"where": where, "error": f"{type(exc).__name__}: {exc}",
                                    "traceback": traceback.format_exc(limit=6)})
        self.save()


# --- comparing a device result with the CPU's ---------------------------------------------------

def _as_float(x):
    import torch

    return x.detach().to("cpu", torch.float64) if isinstance(x, torch.Tensor) else torch.tensor(float(x), dtype=torch.float64)


def compare_tensors(device_value, cpu_value, scale=None):
    """(relative max error, NaN pattern equal): the largest |device - cpu| over ``scale`` (default:
    the largest |cpu| value, at least 1e-30)."""
    import torch

    d, c = _as_float(device_value), _as_float(cpu_value)
    if d.shape != c.shape:
        return math.inf, False
    nan_same = bool(torch.equal(torch.isnan(d), torch.isnan(c)))
    finite = torch.isfinite(c) & torch.isfinite(d)
    inf_same = bool(torch.equal(torch.isinf(d) & ~torch.isnan(d), torch.isinf(c) & ~torch.isnan(c)))
    if not finite.any():
        return 0.0, nan_same and inf_same
    diff = (d[finite] - c[finite]).abs().max().item()
    if scale is None:
        scale = c[finite].abs().max().item()
    return diff / max(float(scale), 1e-30), nan_same and inf_same


def _flatten(result, prefix=""):
    """A loss result ``(loss, metrics)`` / tensor / dict as {name: value}."""
    import torch

    out = {}
    if isinstance(result, torch.Tensor):
        out[prefix or "value"] = result
    elif isinstance(result, dict):
        for k, v in result.items():
            out.update(_flatten(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}"))
    elif isinstance(result, (tuple, list)):
        for i, v in enumerate(result):
            out.update(_flatten(v, f"{prefix}[{i}]"))
    elif isinstance(result, (int, float, bool)):
        out[prefix or "value"] = float(result)
    elif hasattr(result, "__dict__"):  # a dataclass result (e.g. CorrectionResult)
        out.update(_flatten(vars(result), prefix))
    return out


def judge(device_result, cpu_result, dtype_name, scales=None):
    """Compare every tensor of two results; {"ok", "max_err", "worst", "nan_pattern_equal"}."""
    d, c = _flatten(device_result), _flatten(cpu_result)
    if set(d) != set(c):
        return {"ok": False, "max_err": None, "worst": f"outputs differ: {sorted(set(d) ^ set(c))}"}
    worst, worst_err, nan_ok = None, 0.0, True
    ok = True
    for name in d:
        scale = (scales or {}).get(name)
        err, same = compare_tensors(d[name], c[name], scale)
        tol = FRACTION_TOLERANCE[dtype_name] if "frac" in name else TOLERANCE[dtype_name]
        nan_ok &= same
        if err > worst_err or worst is None:
            worst, worst_err = name, err
        ok &= same and err <= tol
    return {"ok": bool(ok), "max_err": worst_err, "worst": worst, "nan_pattern_equal": nan_ok}


# --- inputs ------------------------------------------------------------------------------------

def make_inputs(prompts, samples, tokens, seed=0):
    """CPU fp32 inputs of a realistic rollout batch: log-probs near a policy's (mostly close to 0),
    an old policy a little off, a reference further off, ragged response lengths, 0/1 scores with
    some all-equal groups, per-sequence advantages broadcast over tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    b = prompts * samples
    lengths = torch.randint(tokens // 8, tokens + 1, (b,), generator=g)
    mask = torch.arange(tokens)[None, :] < lengths[:, None]
    log_probs = -torch.rand(b, tokens, generator=g).pow(3) * 4
    old = log_probs + 0.05 * torch.randn(b, tokens, generator=g)
    ref = log_probs + 0.2 * torch.randn(b, tokens, generator=g)
    scores = (torch.rand(prompts, samples, generator=g) < 0.5).float()
    scores[: max(1, prompts // 8)] = 1.0  # all-equal groups
    adv_seq = torch.randn(b, generator=g)
    advantages = adv_seq[:, None].expand(b, tokens).contiguous()
    return {"log_probs": log_probs, "old_log_probs": old.clamp(max=0.0), "ref_log_probs": ref.clamp(max=0.0),
            "mask": mask, "scores": scores, "advantages": advantages,
            "lengths": lengths.view(prompts, samples).float()}


def _to(inputs, device, dtype):
    import torch

    out = {}
    for k, v in inputs.items():
        if k in ("log_probs", "old_log_probs", "ref_log_probs"):
            out[k] = v.to(device=device, dtype=dtype)
        elif k == "mask":
            out[k] = v.to(device)
        else:
            out[k] = v.to(device=device, dtype=torch.float32)
    return out


# --- section: algorithms -------------------------------------------------------------------------

def algorithm_cases():
    """(kind, name, run(inputs) -> result) for every registered algorithm, and the correction modes
    when this rlhf_ext has them. Enumerated from the registries, so algorithms registered by other
    modules (or entry points) are checked too."""
    import rlhf_ext.algorithms as alg
    from rlhf_ext.algorithms import registry

    registry.load_entry_points()
    cases = []
    # Options without a default that a host always passes; a loss that draws tokens at random gets a
    # seed, so that the CPU and the device draw the same ones (a CPU generator either way).
    required = {"passk": {"k": 4}, "clip_cov": {"seed": 0}, "kl_cov": {"seed": 0}}

    for name in alg.available_advantages():
        fn = alg.get_advantage(name)
        needs = alg.host_inputs(fn) if hasattr(alg, "host_inputs") else ()

        def run_adv(x, fn=fn, needs=needs, options=required.get(name, {})):
            kwargs = {}
            if "lengths" in needs:
                kwargs["lengths"] = x["lengths"]
            if "components" in needs:
                kwargs["components"] = {"accuracy": x["scores"], "format": 1.0 - x["scores"] * 0.5}
            if "turns" in needs:  # two turns per trajectory: the prompt's state, then one of two states
                kwargs["turns"] = [[[(0.0, 0), (float(s), 1 + n % 2)] for n, s in enumerate(row)]
                                   for row in x["scores"].tolist()]
            kwargs.update(_accepted(fn, options))
            return fn(x["scores"], **kwargs)

        cases.append(("advantage", name, run_adv))

    for name in alg.available_policy_losses():
        fn = alg.get_policy_loss(name)

        def run_loss(x, fn=fn, options=required.get(name, {})):
            import torch

            lp = x["log_probs"].detach().clone().requires_grad_(True)
            loss, metrics = fn(lp, x["old_log_probs"], x["advantages"].to(lp.dtype), x["mask"],
                               **_accepted(fn, options))
            total = alg.aggregate_loss(loss.float(), x["mask"], "token-mean")
            (grad,) = torch.autograd.grad(total, lp, allow_unused=True)
            out = {"loss": loss.detach(), "metrics": {k: v for k, v in (metrics or {}).items()},
                   "token_mean": total.detach()}
            if grad is not None:
                out["grad"] = grad
            return out

        cases.append(("policy_loss", name, run_loss))

    for mode in alg.LOSS_AGG_MODES:
        def run_agg(x, mode=mode):
            per_token = (x["log_probs"].float() - x["old_log_probs"].float()) * x["advantages"]
            return {"value": alg.aggregate_loss(per_token, x["mask"], mode),
                    "abs": alg.aggregate_loss(per_token.abs(), x["mask"], mode)}

        cases.append(("aggregation", mode, run_agg))

    for name in alg.available_kl_estimators():
        fn = alg.get_kl_estimator(name)
        cases.append(("kl", name, lambda x, fn=fn: fn(x["log_probs"], x["ref_log_probs"])))

    # rollout correction (issue 23), when this rlhf_ext has it
    if all(hasattr(alg, a) for a in ("rollout_correction", "RolloutCorrection")):
        configs = []
        for level in getattr(alg, "IS_LEVELS", ()):
            configs.append((f"is_level={level}", {"is_level": level}))
        for option in getattr(alg, "REJECTION_OPTIONS", ()):
            configs.append((f"rejection={option}", {"rejection": option}))
        for label, spec in configs:
            def run_corr(x, spec=spec):
                config = _correction_config(alg, spec)
                return alg.rollout_correction(x["old_log_probs"], x["log_probs"], x["mask"], config)

            cases.append(("correction", label, run_corr))
    return cases


def _accepted(fn, options):
    """The ``options`` that ``fn`` takes (a keyword it lacks is left out, unless it takes **kwargs)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(options)
    return {k: v for k, v in options.items() if k in params}


def _correction_config(alg, spec):
    """A RolloutCorrection for one mode, trying the threshold spellings its validation accepts."""
    if "is_level" in spec:
        return alg.RolloutCorrection(is_level=spec["is_level"])
    errors = []
    for threshold in (2.0, (0.5, 2.0), "0.5_2.0", 0.5):
        try:
            return alg.RolloutCorrection(rejection={spec["rejection"]: threshold})
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
    raise ValueError(f"no threshold accepted for {spec['rejection']}: {errors[-1]}")


def _scales(kind, cpu_result):
    """The magnitude each scalar output is judged against (see :func:`compare_tensors`)."""
    if kind == "aggregation":
        return {"value": float(abs(cpu_result["abs"]))}
    return None


def run_algorithms(report, device, shapes, dtypes, deadline):
    import torch

    name = "algorithms"
    sec = report.section(name)
    cases = algorithm_cases()
    sec["cases"] = len(cases)
    sec["shape"] = {"prompts": shapes[0], "samples": shapes[1], "tokens": shapes[2]}
    base = make_inputs(*shapes)
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        cpu_in = _to(base, "cpu", dtype)
        dev_in = _to(base, device, dtype)
        for kind, label, run in cases:
            entry = {"kind": kind, "name": label, "dtype": dtype_name}
            cpu_result = None
            try:
                with time_limit(min(120.0, deadline - time.monotonic()), f"{kind} {label} ({dtype_name})"):
                    t0 = time.perf_counter()
                    cpu_result = run(cpu_in)
                    t1 = time.perf_counter()
                    dev_result = run(dev_in)
                    if device != "cpu":
                        torch.cuda.synchronize()
                    t2 = time.perf_counter()
                entry.update(judge(dev_result, cpu_result, dtype_name, _scales(kind, cpu_result)))
                entry.update({"cpu_s": round(t1 - t0, 4), "device_s": round(t2 - t1, 4)})
            except SectionTimeout as exc:
                entry.update({"ok": False, "error": str(exc)})
                report.add(name, entry)
                raise
            except Exception as exc:  # noqa: BLE001 - record it and go on with the next case
                entry.update({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                              "failed_on": "device" if cpu_result is not None else "cpu"})
            report.add(name, entry)
        del cpu_in, dev_in
        if device != "cpu":
            torch.cuda.empty_cache()


# --- section: the guard and step metrics on a real training step ---------------------------------

class SyncCounter:
    """Counts calls that make the host wait for the device: on tensors of ``device`` (on the CPU
    these are the calls that *would* synchronize on an accelerator)."""

    METHODS = ("item", "__bool__", "__float__", "__int__", "tolist", "cpu", "numpy")

    def __init__(self, device):
        self.device_type = "cuda" if str(device).startswith("cuda") else "cpu"
        self.count = 0
        self.active = False
        self._saved = {}

    def __enter__(self):
        import torch

        counter = self

        def wrap(method):
            original = getattr(torch.Tensor, method)

            def counted(t, *a, **k):
                if counter.active and t.device.type == counter.device_type:
                    counter.count += 1
                return original(t, *a, **k)

            return original, counted

        for m in self.METHODS:
            original, counted = wrap(m)
            self._saved[m] = original
            setattr(torch.Tensor, m, counted)
        if torch.cuda.is_available():
            original_sync = torch.cuda.synchronize

            def sync(*a, **k):
                if counter.active:
                    counter.count += 1
                return original_sync(*a, **k)

            self._saved["synchronize"] = original_sync
            torch.cuda.synchronize = sync
        return self

    def __exit__(self, *exc):
        import torch

        for m, original in self._saved.items():
            if m == "synchronize":
                torch.cuda.synchronize = original
            else:
                setattr(torch.Tensor, m, original)


def model_config(cpu: bool):
    from transformers import Qwen2Config

    if cpu:
        return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           tie_word_embeddings=True)
    # Qwen2.5-0.5B's shape (about 494M parameters)
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, tie_word_embeddings=True, rms_norm_eps=1e-6)


def run_step(report, device, cpu, steps, batch, seq, deadline):
    import torch
    from transformers import Qwen2ForCausalLM

    import rlhf_ext.algorithms as alg
    from rlhf_ext.patches.openrlhf import guard as guard_mod
    from rlhf_ext.patches.openrlhf.updates import micro_batch_signal

    name = "step"
    sec = report.section(name)
    torch.manual_seed(0)
    cfg = model_config(cpu)
    dtype = torch.bfloat16
    with torch.device(device):  # initialised where it trains: 0.5B parameters are slow to init on a CPU
        model = Qwen2ForCausalLM(cfg)
    model = model.to(dtype=dtype)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    n_params = sum(p.numel() for p in model.parameters())
    sec.update({"params": n_params, "batch": batch, "seq": seq, "dtype": "bfloat16", "device": str(device)})
    report.save()

    class Args:
        class rlhf_ext:  # noqa: N801 - the shape OpenRLHF's args have
            guard = "stop"
            run_dir = None
            step_metrics = "all"

    class Trainer:
        def __init__(self):
            self.args, self.strategy, self.actor = Args(), object(), model

    class Exp:
        pass

    trainer = Trainer()
    guard = guard_mod.Guard(trainer)
    guard.train_calls = 1

    g = torch.Generator().manual_seed(1)
    seqs = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
    mask = (torch.arange(seq - 1)[None, :] < torch.randint(seq // 2, seq, (batch,), generator=g)[:, None]).to(device)
    advantages = torch.randn(batch, 1, generator=g).expand(batch, seq - 1).contiguous().to(device)
    with torch.no_grad():
        out = model(seqs)
        old = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, seqs[:, 1:, None]).squeeze(-1)
        ref = old + 0.01 * torch.randn(old.shape, generator=g).to(device)
        del out

    def step(use_guard, use_metrics):
        out = model(seqs)
        logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, seqs[:, 1:, None]).squeeze(-1)
        del out
        loss_tok, metrics = alg.ppo(logp, old, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
        pl = alg.aggregate_loss(loss_tok, mask, "token-mean")
        kl, kl_metrics = alg.kl_estimate(logp, ref, "k3", mask=mask)
        loss = pl + 0.001 * alg.aggregate_loss(kl, mask, "token-mean")
        logged = {}
        if use_metrics:
            logged.update({k: v.detach() for k, v in metrics.items()})
            logged.update({k: v.detach() for k, v in kl_metrics.items()})
        if use_guard:
            exp = Exp()
            exp.action_mask, exp.advantages, exp.action_log_probs = mask, advantages, old
            exp.index, exp.prompts = list(range(batch)), [""] * batch
            mb = guard_mod._MicroBatch(trainer, exp, 0)
            mb.log_probs, mb.policy_loss = logp, loss_tok
            loss = guard.before_backward(mb, loss)
        loss.backward()
        if use_metrics:
            logged["update_signal"] = micro_batch_signal(advantages, mask)
        if use_guard:
            guard.before_step(mb, model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if use_metrics:  # OpenRLHF reduces its status to Python numbers every step
            for k, v in list(logged.items()):
                logged[k] = float(v)
        return loss.detach()

    variants = {"plain": (False, False), "guard": (True, False), "metrics": (False, True), "both": (True, True)}
    times = {v: [] for v in variants}
    syncs = {v: [] for v in variants}
    debug_syncs = {v: [] for v in variants}
    cuda = str(device).startswith("cuda")
    warmup = 1 if cpu else 2

    def wait():
        if cuda:
            torch.cuda.synchronize()

    with SyncCounter(device) as counter:
        for i in range(steps + warmup):
            for v in (list(variants) if i % 2 == 0 else list(variants)[::-1]):
                if time.monotonic() > deadline:
                    raise SectionTimeout("step section ran out of its time")
                wait()
                counter.count, counter.active = 0, True
                caught = contextlib.nullcontext()
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                    caught = warnings.catch_warnings(record=True)
                t0 = time.perf_counter()
                with caught as seen:
                    if cuda:
                        warnings.simplefilter("always")
                    step(*variants[v])
                    counter.active = False
                    if cuda:
                        torch.cuda.set_sync_debug_mode(0)
                    wait()
                dt = time.perf_counter() - t0
                if i >= warmup:
                    times[v].append(dt)
                    syncs[v].append(counter.count)
                    if cuda:
                        debug_syncs[v].append(sum("synchroniz" in str(w.message).lower() for w in (seen or [])))
            if i >= warmup:
                sec["progress"] = f"{i - warmup + 1}/{steps} rounds"
                report.save()
    plain = statistics.median(times["plain"])
    rows = []
    for v in variants:
        med = statistics.median(times[v])
        row = {"variant": v, "median_step_s": round(med, 5), "ratio_to_plain": round(med / plain, 4),
               "host_syncs_per_step": statistics.median(syncs[v]),
               "host_syncs_added": statistics.median(syncs[v]) - statistics.median(syncs["plain"])}
        if cuda:
            row["cuda_sync_debug_per_step"] = statistics.median(debug_syncs[v]) if debug_syncs[v] else None
        rows.append(row)
        report.add(name, row)
    sec["goal"] = "guard and metrics on <= 1.02x the plain step"
    sec["goal_met"] = next(r for r in rows if r["variant"] == "both")["ratio_to_plain"] <= 1.02
    report.save()


# --- driver --------------------------------------------------------------------------------------

def summary_table(report) -> str:
    lines = []
    alg = report.data["sections"].get("algorithms", {})
    results = alg.get("results", [])
    if results:
        lines.append(f"algorithms on {report.data.get('device')} vs CPU, shape {alg.get('shape')}:")
        lines.append(f"  {'kind':12s} {'name':28s} {'dtype':9s} {'ok':4s} {'max_err':>10s}  {'cpu s':>7s} {'dev s':>7s}  worst")
        for r in results:
            err = r.get("max_err")
            lines.append(f"  {r['kind']:12s} {r['name'][:28]:28s} {r['dtype']:9s} {'yes' if r.get('ok') else 'NO':4s} "
                         f"{(f'{err:.2e}' if isinstance(err, float) else '-'):>10s}  {r.get('cpu_s', '-')!s:>7s} "
                         f"{r.get('device_s', '-')!s:>7s}  {r.get('worst') or r.get('error', '')}")
        bad = [r for r in results if not r.get("ok")]
        lines.append(f"  {len(results) - len(bad)}/{len(results)} passed")
    step = report.data["sections"].get("step", {})
    if step.get("results"):
        lines.append(f"training step: Qwen2 {step.get('params', 0) / 1e6:.1f}M params, {step.get('dtype')}, "
                     f"batch {step.get('batch')} x {step.get('seq')} tokens, AdamW, on {step.get('device')}:")
        lines.append(f"  {'variant':10s} {'median s':>10s} {'ratio':>8s} {'host syncs':>11s} {'added':>6s} {'cuda dbg':>9s}")
        for r in step["results"]:
            lines.append(f"  {r['variant']:10s} {r['median_step_s']:10.4f} {r['ratio_to_plain']:8.4f} "
                         f"{r['host_syncs_per_step']:11.0f} {r['host_syncs_added']:6.0f} "
                         f"{str(r.get('cuda_sync_debug_per_step', '-')):>9s}")
        lines.append(f"  goal: {step.get('goal')}: {'met' if step.get('goal_met') else 'NOT met'}")
    for name, sec in report.data["sections"].items():
        if sec.get("status") not in ("done",):
            lines.append(f"section {name}: {sec.get('status')} {sec.get('error', '')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU with small shapes (CI)")
    parser.add_argument("--json", default=None, help="write results here, updated as they come")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run (default 420 on CUDA, 50 with --cpu)")
    parser.add_argument("--shape", default=None, help="PROMPTS,SAMPLES,TOKENS for the algorithms (default "
                                                      "512,8,4096 on CUDA, 4,4,32 with --cpu)")
    parser.add_argument("--steps", type=int, default=None, help="measured rounds of the four step variants")
    parser.add_argument("--sections", default="algorithms,step", help="comma list of sections to run")
    args = parser.parse_args(argv)
    start = time.monotonic()
    budget = args.budget if args.budget is not None else (50.0 if args.cpu else 420.0)
    deadline = start + budget
    report = Report(args.json)

    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        print(f"device_check: cannot import torch: {exc}", file=sys.stderr)
        return 2
    if args.cpu:
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        print("device_check: no CUDA device is visible (torch.cuda.is_available() is False); "
              "run with --cpu for the small CPU check", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 comparisons against the CPU must not use TF32
    torch.backends.cudnn.allow_tf32 = False
    if args.cpu:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    shapes = tuple(int(x) for x in (args.shape or ("4,4,32" if args.cpu else "512,8,4096")).split(","))
    if len(shapes) != 3 or min(shapes) < 1:
        parser.error(f"--shape needs PROMPTS,SAMPLES,TOKENS, got {args.shape!r}")
    steps = args.steps or (2 if args.cpu else 20)
    batch, seq = (2, 32) if args.cpu else (8, 1024)
    report.data.update({
        "device": torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({platform.processor() or platform.machine()})",
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "host": platform.node(), "mode": "cpu" if args.cpu else "cuda", "budget_s": budget,
    })
    try:
        import transformers

        report.data["transformers"] = transformers.__version__
    except Exception as exc:  # noqa: BLE001
        report.data["transformers"] = f"unavailable: {exc}"
    report.save()
    print(f"device_check: {report.data['device']}, torch {torch.__version__}, budget {budget:.0f} s", flush=True)

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    # the step section gets its share of the budget even if the algorithms take long
    alg_deadline = deadline if "step" not in sections else start + budget * (0.55 if not args.cpu else 0.6)
    for name in sections:
        sec = report.section(name)
        t0 = time.monotonic()
        try:
            if name == "algorithms":
                run_algorithms(report, device, shapes, ("float32", "bfloat16"), alg_deadline)
            elif name == "step":
                with time_limit(deadline - time.monotonic(), "step section"):
                    run_step(report, device, args.cpu, steps, batch, seq, deadline)
            else:
                raise ValueError(f"unknown section {name!r} (algorithms, step)")
            sec["status"] = "done"
        except SectionTimeout as exc:
            sec.update({"status": "timeout", "error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - one section's failure must not lose the others
            sec.update({"status": "error", "error": f"{type(exc).__name__}: {exc}"})
            report.error(name, exc)
        sec["seconds"] = round(time.monotonic() - t0, 1)
        report.save()
        print(f"  section {name}: {sec['status']} in {sec['seconds']} s", flush=True)

    report.data["heavy_modules_imported"] = sorted(m for m in HEAVY_MODULES if m in sys.modules)
    report.data["seconds"] = round(time.monotonic() - start, 1)
    all_ok = all(r.get("ok", True) for r in report.data["sections"].get("algorithms", {}).get("results", []))
    finished = all(report.data["sections"][s].get("status") == "done" for s in sections)
    report.data["all_comparisons_ok"] = all_ok
    report.data["complete"] = finished
    report.save()
    print()
    print(summary_table(report))
    print(f"\n{'OK' if all_ok and finished else 'FAILED'}: {report.data['seconds']} s"
          + (f"; JSON in {args.json}" if args.json else ""))
    return 0 if all_ok and finished else 1


if __name__ == "__main__":
    sys.exit(main())
