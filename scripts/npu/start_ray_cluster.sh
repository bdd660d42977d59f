#!/usr/bin/env bash
# Start one node of a Ray cluster on an Ascend NPU machine (run it on every node: head first)
# (scripts/lib/start_ray_cluster.sh, one script for both devices; --help for the options).
set -euo pipefail
exec bash "$(dirname "$0")/../lib/start_ray_cluster.sh" npu "$@"
