#!/usr/bin/env bash
# MaxRL (Tajwar et al. 2026, arXiv 2602.02710): maximum-likelihood advantage (r - mean) / mean on 0/1
# correctness, so hard prompts weigh more than under GRPO.
source "$(dirname "$0")/recipe.sh"
run_recipe --algo.advantage.estimator maxrl --algo.advantage.input score "$@"
