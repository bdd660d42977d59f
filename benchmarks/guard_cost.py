"""What the non-finite guard (``--rlhf_ext.guard``) costs a training step, and that it changes nothing.

Runs the same training loop twice in one process, alternating steps between two identically
seeded copies so machine load hits both alike: a Qwen2 policy (transformers, random weights), a
PPO-clip loss on random advantages, backward and AdamW, with one micro-batch per optimizer step
(the guard's worst case: a collective before every backward and before every step). The guarded
copy runs the guard's real code (:class:`rlhf_ext.patches.openrlhf.guard.Guard`: the checks
before backward including the all_reduce over a gloo group, and the gradient check at the
boundary). It prints the median step time of each, the ratio, and whether the two copies' losses
and weights stayed bit-identical (the guard only reads).

    python benchmarks/guard_cost.py                    # 40 steps, hidden 256, 4 layers, batch 8 x 128
    python benchmarks/guard_cost.py --steps 100 --hidden 512 --layers 8

Goal (issue #11): <= 2% per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="measured steps per side (default 40)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first (default 3)")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (default 256)")
    parser.add_argument("--layers", type=int, default=4, help="layers (default 4)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per micro-batch (default 8)")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier timings)")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlhf_ext.patches.openrlhf import guard as g

    torch.set_num_threads(args.threads)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)

    cfg = Qwen2Config(vocab_size=1024, hidden_size=args.hidden, intermediate_size=args.hidden * 4,
                      num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                      num_key_value_heads=1, max_position_embeddings=args.seq * 2)  # fmt: skip

    def build():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)

    class Args:
        class rlhf_ext:  # noqa: N801
            guard = "stop"
            run_dir = None

    class Trainer:
        def __init__(self, model):
            self.args, self.strategy, self.actor = Args(), object(), model

    class Exp:
        pass

    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(args.warmup + args.steps):
        seq = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=gen)
        e = Exp()
        e.action_mask = torch.ones(args.batch, args.seq - 1, dtype=torch.bool)
        e.advantages = torch.randn(args.batch, args.seq - 1, generator=gen)
        e.action_log_probs = None
        e.index, e.prompts = list(range(args.batch)), [""] * args.batch
        batches.append((seq, e))

    def step(model, opt, guard, seq, exp):
        out = model(seq)
        logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, seq[:, 1:, None]).squeeze(-1)
        old = exp.action_log_probs if exp.action_log_probs is not None else logp.detach()
        ratio = torch.exp(logp - old)
        pl = -torch.min(ratio * exp.advantages, ratio.clamp(0.8, 1.2) * exp.advantages).mean()
        loss = pl
        if guard is not None:
            mb = g._MicroBatch(guard_trainer[id(model)], exp, 0)
            mb.log_probs, mb.policy_loss = logp, pl
            guard.before_backward(mb, loss)
        loss.backward()
        if guard is not None:
            guard.before_step(mb, model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    base_model, base_opt = build()
    guard_model, guard_opt = build()
    guard_trainer = {id(guard_model): Trainer(guard_model)}
    guard = g.Guard(guard_trainer[id(guard_model)])
    guard.train_calls = 1

    times = {"off": [], "guard": []}
    losses = {"off": [], "guard": []}
    for i, (seq, exp) in enumerate(batches):
        order = ("off", "guard") if i % 2 == 0 else ("guard", "off")
        for side in order:
            model, opt, gd = (base_model, base_opt, None) if side == "off" else (guard_model, guard_opt, guard)
            t0 = time.perf_counter()
            loss = step(model, opt, gd, seq, exp)
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times[side].append(dt)
                losses[side].append(loss)

    identical_loss = losses["off"] == losses["guard"]
    identical_weights = all(torch.equal(a, b) for a, b in zip(base_model.parameters(), guard_model.parameters()))
    off, on = statistics.median(times["off"]), statistics.median(times["guard"])
    n_params = sum(p.numel() for p in base_model.parameters())
    print(f"model: Qwen2 {n_params / 1e6:.1f}M params, micro-batch {args.batch} x {args.seq} tokens, "
          f"{args.steps} steps per side, {args.threads} thread(s)")
    print(f"no guard:   median {off * 1000:8.1f} ms/step")
    print(f"guard stop: median {on * 1000:8.1f} ms/step")
    print(f"ratio guard/no guard: {on / off:.4f} ({(on / off - 1) * 100:+.2f}%)")
    print(f"losses bit-identical: {identical_loss}; weights bit-identical: {identical_weights}")
    dist.destroy_process_group()
    return 0 if identical_loss and identical_weights else 1


if __name__ == "__main__":
    sys.exit(main())
