#!/usr/bin/env bash
# The baseline: verl's own GRPO, with rlhf_ext's math reward.
source "$(dirname "$0")/recipe.sh"
run_recipe "$@"
