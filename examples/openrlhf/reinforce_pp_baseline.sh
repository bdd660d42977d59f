#!/usr/bin/env bash
# REINFORCE++-baseline (Hu 2025, arXiv 2501.03262): group-mean baseline, then token advantages
# whitened over the whole batch.
source "$(dirname "$0")/recipe.sh"
run_recipe --algo.advantage.estimator reinforce_pp_baseline "$@"
