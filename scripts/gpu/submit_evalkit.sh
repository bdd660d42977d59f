#!/usr/bin/env bash
# Submit an rlhf_ext evalkit run with --dp data-parallel vLLM engines as a Ray job on a CUDA GPU cluster
# (scripts/lib/submit_evalkit.sh, one script for both devices; --help for the options).
set -euo pipefail
exec bash "$(dirname "$0")/../lib/submit_evalkit.sh" cuda "$@"
