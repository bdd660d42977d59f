"""Ray ``worker_process_setup_hook`` for the scenario clusters: what the rlhf_ext plugin does in
every Ray worker (flash_attn fallback for OpenRLHF's imports, then the device retarget)."""


def setup():
    from rlhf_ext.patches.flash_attn_fallback import install
    from rlhf_ext.patches.retarget import apply_openrlhf_retarget

    install()
    apply_openrlhf_retarget()
