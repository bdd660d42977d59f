"""A two-turn math agent for OpenRLHF's multi-turn mode, rewarded by rlhf_ext's ``math`` reward.

    python -m openrlhf.cli.train_ppo_ray --plugin rlhf_ext ... \\
        --train.agent_func_path examples/openrlhf/agent_two_turn_math.py

Turn 1: the model answers the prompt. The environment says whether that answer was right and asks
for the final answer (ChatML, the tiny task's and Qwen's chat format). Turn 2: the model answers
again; the episode's reward is rlhf_ext's ``math`` reward of that final answer (the first turn
earns 0), its ``scores`` the final answer's correctness. The environment's tokens are not the
model's: OpenRLHF leaves them out of ``action_mask``, so they carry no loss and no advantage.
``extra_logs`` has the same keys at both turns (OpenRLHF keeps the last turn's, and every sample
must have the same keys).
"""

from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from rlhf_ext.rewards import agent_reward

reward = agent_reward("rlhf_ext:math")

FEEDBACK = "\n<|im_start|>user\n{verdict} Final answer?<|im_end|>\n<|im_start|>assistant\n"


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args, **kwargs):
        self.turn = 0
        self.first_correct = 0.0

    async def reset(self, states: dict, **kwargs):
        return {"observation": states["observation"]}

    async def step(self, states: dict, **kwargs):
        self.turn += 1
        # grades this turn's answer (states["action_text"]) against states["label"], off the event loop
        out = await reward.acall(states)
        if self.turn == 1:
            self.first_correct = float(out["scores"])
        logs = {**out["extra_logs"], "agent/first_turn_correct": out["scores"].new_tensor(self.first_correct)}
        if self.turn == 1:
            verdict = "Correct." if self.first_correct else "Not quite."
            return {"rewards": out["rewards"] * 0, "scores": out["scores"], "environment_feedback":
                    FEEDBACK.format(verdict=verdict), "done": False, "extra_logs": logs}
        return {"rewards": out["rewards"], "scores": out["scores"], "environment_feedback": "", "done": True,
                "extra_logs": logs}


class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self):
        super().__init__(AgentInstance)
