"""vLLM ``vllm.general_plugins`` entry point: activate rlhf_ext plugins inside vLLM's processes.

vLLM calls :func:`register` in every process it starts (front end, engine core, workers), and in
any process that merely builds an engine, so it must cost nothing unless a plugin was requested
through ``RLHF_EXT_PLUGINS`` -- which the driver exports and Ray and vLLM pass down. In most
set-ups the start-up hook has already activated the plugins by then and this is a no-op; it
covers environments where the ``.pth`` file is not processed. Set ``VLLM_PLUGINS`` to restrict
vLLM's plugins, and include ``rlhf_ext`` in it.
"""

import os


def register() -> None:
    if not os.environ.get("RLHF_EXT_PLUGINS"):
        return
    from .plugin import activate

    activate(role="vllm")
