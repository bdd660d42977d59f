"""Shared by the scenario scripts in this directory (run as subprocesses by tests/test_npu_*.py and
tests/test_retarget_*.py).

Each scenario runs checks in one fresh interpreter -- the device shims patch torch process-wide,
which must not leak into the pytest process -- and prints one result line that the test parses.
A check that raises is recorded as ``{"error": ...}`` so the test names exactly what failed.
"""

import json
import os
import socket
import sys
import traceback
from types import SimpleNamespace

RESULT_MARK = "RLHF_EXT_SCENARIO_RESULT "


class Results(dict):
    def check(self, name, fn):
        try:
            self[name] = fn()
        except BaseException as exc:  # noqa: BLE001 - report every failure to the test
            self[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=6)}
        return self[name]

    def emit(self):
        # Own line even if a library left a partial line on stdout.
        sys.stdout.write("\n" + RESULT_MARK + json.dumps(self, default=repr) + "\n")
        sys.stdout.flush()


def install_flash_attn_fallback():
    """OpenRLHF imports flash_attn.bert_padding at module level; serve rlhf_ext's pure-torch one."""
    from rlhf_ext.patches.flash_attn_fallback import install

    install()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ns(**kwargs):
    return SimpleNamespace(**kwargs)


def ppo_args(sync_backend="nccl", colocate_all=True, sync_with_ray=False, ring_attn_size=1):
    """The slice of OpenRLHF 0.11.2's parsed train_ppo_ray arguments that the trainer classes read."""
    return ns(
        actor=ns(eps_clip_low_high=(0.2, 0.28), dual_clip=None, loss_agg_mode="token-mean", policy_loss_type="ppo",
                 aux_loss_coef=0.0, entropy_coef=None),
        algo=ns(advantage=ns(is_correction_level="off", is_correction_mode="mask", is_correction_gating="ratio",
                             is_correction_threshold=(0.5, 5.0))),
        ds=ns(packing_samples=False, param_dtype="bf16", zero_stage=0, ring_attn_size=ring_attn_size,
              tensor_parallel_size=1, adam_offload=False),
        train=ns(dynamic_batch_enable=False, max_epochs=1, colocate_all=colocate_all, async_enable=False,
                 seed=42, micro_batch_size=1, batch_size=1),
        vllm=ns(sync_backend=sync_backend, sync_with_ray=sync_with_ray, num_engines=1, tensor_parallel_size=1),
        local_rank=-1,
    )  # fmt: skip


def init_single_process_group(backend="nccl"):
    """A world of one, as every Ray actor of a one-GPU OpenRLHF role has."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group(backend, rank=0, world_size=1)
    return dist.get_backend()
