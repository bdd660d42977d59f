"""``--vllm.enable_sleep`` / ``--ds.enable_sleep`` on the retarget's targets (driver, after parsing).

Sleep mode frees accelerator memory between the phases of a colocated (``--train.colocate_all``)
step: vLLM's engines release their weights and KV cache while DeepSpeed trains, and DeepSpeed
offloads its states while vLLM generates. It is a device-memory feature:

* **CPU target** (``RLHF_EXT_DEVICE=cpu``): there is no device memory to free, and vLLM's CPU
  platform refuses the engine argument ("Sleep mode is not supported on current platform"). Both
  flags are turned off here, with one line on stderr, so a hybrid-engine recipe smoke-tests as it
  stands; the colocation itself is kept.
* **NPU target**: vllm-ascend implements vLLM's sleep mode with its own pluggable allocator, and
  ``CaMemAllocator.__init__`` (``vllm_ascend/device_allocator/camem.py``) asserts that
  ``PYTORCH_NPU_ALLOC_CONF`` does not contain ``expandable_segments:True`` ("Expandable segments are
  not compatible with memory pool", pytorch/pytorch#147851; the same check as vLLM's CUDA allocator,
  vllm-project/vllm#14189). vllm-ascend itself adds expandable segments only when sleep mode is off
  (vllm-project/vllm-ascend#5855). rlhf_ext's own NPU default *is* ``expandable_segments:True``
  (:mod:`rlhf_ext.npu.hccl_env`), so with sleep on the plugin sets ``expandable_segments:False``
  instead, in the driver and, through ``RLHF_EXT_NPU_SLEEP_MODE=1``, in every Ray worker; a user's
  own ``expandable_segments:True`` is refused at start-up (an argparse error naming the fix) rather
  than failing an assertion inside each rollout engine minutes later. One line says which.
* **CUDA**: untouched.

OpenRLHF applies vLLM's sleep only with ``--train.colocate_all`` (``train_ppo_ray.py`` turns
``--vllm.enable_sleep`` off otherwise), so only then is the allocator checked.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, MutableMapping, Optional

from rlhf_ext.npu.hccl_env import ALLOC_CONF, SLEEP_MODE_ALLOC_CONF, SLEEP_MODE_ENV

SLEEP_FLAGS = (("vllm.enable_sleep", "--vllm.enable_sleep"), ("ds.enable_sleep", "--ds.enable_sleep"))
EXPANDABLE_ON = "expandable_segments:true"


def _expandable_on(conf: str) -> bool:
    # torch's allocator-config parser reads "key:value" pairs separated by commas; spaces are not allowed
    return EXPANDABLE_ON in conf.replace(" ", "").lower()


def _target() -> str:
    from rlhf_ext.patches.retarget.state import current_backend

    return current_backend()


def finalize(namespace, backend: Optional[str] = None, environ: Optional[MutableMapping[str, str]] = None,
             stderr=None) -> Dict[str, str]:
    """Adjust the sleep flags for ``backend`` (the retarget's, by default); returns the environment to export.

    Raises ``ValueError`` (the argparse error) for a user's ``expandable_segments:True`` with sleep on NPU.
    """
    backend = backend or _target()
    environ = os.environ if environ is None else environ
    stderr = sys.stderr if stderr is None else stderr
    on = [flag for dest, flag in SLEEP_FLAGS if getattr(namespace, dest, False)]
    if not on or backend == "cuda":
        return {}
    if backend == "cpu":
        for dest, _ in SLEEP_FLAGS:
            setattr(namespace, dest, False)
        verb = "is a GPU/NPU memory feature" if len(on) == 1 else "are GPU/NPU memory features"
        stderr.write(f"rlhf_ext: {' and '.join(on)} {verb}; off on the CPU target\n")
        return {}
    if backend != "npu" or not getattr(namespace, "vllm.enable_sleep", False):
        return {}  # --ds.enable_sleep alone offloads DeepSpeed's states: no vllm-ascend allocator involved
    if not getattr(namespace, "train.colocate_all", False):
        return {}  # OpenRLHF turns --vllm.enable_sleep off itself (and says so)
    from rlhf_ext.npu.hccl_env import applied_defaults

    conf = environ.get(ALLOC_CONF)
    ours = conf is not None and applied_defaults().get(ALLOC_CONF) == conf
    if conf is not None and not ours and _expandable_on(conf):
        raise ValueError(
            f"--vllm.enable_sleep on NPU: {ALLOC_CONF}={conf} turns on expandable segments, which vllm-ascend's "
            "sleep mode refuses (CaMemAllocator asserts it in every rollout engine; pytorch/pytorch#147851): unset "
            f"it or use expandable_segments:False, or drop --vllm.enable_sleep (docs/npu.md)"
        )
    env = {SLEEP_MODE_ENV: "1"}
    if conf is None or ours:
        env[ALLOC_CONF] = SLEEP_MODE_ALLOC_CONF
        stderr.write(f"rlhf_ext: --vllm.enable_sleep on NPU: {ALLOC_CONF}={SLEEP_MODE_ALLOC_CONF} for every "
                     "process (vllm-ascend's sleep mode refuses expandable segments; rlhf_ext's NPU default "
                     "expandable_segments:True is off for this run)\n")
    else:
        stderr.write(f"rlhf_ext: --vllm.enable_sleep on NPU: {ALLOC_CONF}={conf} kept (no expandable segments, "
                     "as vllm-ascend's sleep mode needs)\n")
    return env
