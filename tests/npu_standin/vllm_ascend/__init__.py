"""Stand-in for vllm-ascend (tests only): just the HCCL communicator rlhf_ext uses for weight sync."""
