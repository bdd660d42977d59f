#!/usr/bin/env bash
# Pass@k training (Chen et al. 2025, arXiv 2508.10751): the analytic Pass@k advantage with k = 4 of
# the 8 samples. It needs 0/1 rewards, so it reads the reward file's correctness ("scores").
source "$(dirname "$0")/recipe.sh"
run_recipe --algo.advantage.estimator passk --algo.advantage.passk_k 4 --algo.advantage.input score "$@"
