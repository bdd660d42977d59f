"""Reward functions (Open-R1 rule rewards) and a math grader safe to run inside a training job."""
