"""``rollout.source: gateway``: agent programs run per episode against the trainer's policy; a
crashed or timed-out program ends only its own episode and leaves its group's baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowgrpo.algorithms.advantages import get_estimator
from flowgrpo.gateway.agents import GatewayRollout, summarize
from flowgrpo.modeling.models import tiny_model
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.rollout.engine import GatewayAgentConfig, RolloutConfig
from flowgrpo.types import Task, Termination

TESTS = str(Path(__file__).resolve().parent)


def test_a_crashed_or_hung_agent_ends_only_its_episode_and_leaves_the_baseline():
    model, tok = tiny_model()
    agent = GatewayAgentConfig(
        callable="gateway_test_agents:by_index", timeout_s=8, env={"PYTHONPATH": TESTS}
    )
    cfg = RolloutConfig(source="gateway", gateway=agent, max_new_tokens=4)
    gw = GatewayRollout(HFBackend(model, tok), tok, cfg, agent)
    try:
        [group] = gw.run_groups([Task(id="t-1", prompt="What is 2 + 3?", answer="5")], 3, policy_version=3)
    finally:
        gw.close()
    ok, crashed, hung = group.trajectories
    # a call cut at max_new_tokens=4 says so in the termination, as the engine's would
    cut = ok.turns[-1].finish_reason == "length"
    assert ok.termination == (Termination.max_tokens if cut else Termination.finished)
    assert ok.reward == 1.0 and ok.excluded is None
    assert ok.policy_version == 3 and len(ok.turns) == 1 and ok.task_id == "t-1"
    assert crashed.termination == Termination.error and crashed.excluded == "agent:exit 1"
    assert len(crashed.turns) == 1  # its model call was recorded before it crashed
    assert "the agent's own bug" in crashed.metadata["agent_output"]
    assert hung.termination == Termination.error and hung.excluded == "agent:timeout"
    assert "timeout_s=8" in hung.metadata["error"]
    assert summarize([group])["failed"] == {"agent:exit 1": 1, "agent:timeout": 1}
    get_estimator("flow_grpo")([group])
    assert crashed.turns[0].advantage == 0.0  # out of the update and of the group's statistics


def test_the_gateway_source_is_configured_with_errors_that_say_how():
    with pytest.raises(ValueError, match=r"rollout\.gateway\.command"):
        RolloutConfig(source="gateway")
    with pytest.raises(ValueError, match="exactly one of"):
        GatewayAgentConfig(command=["x"], callable="m:f")
    with pytest.raises(ValueError, match=r"package\.module:function"):
        GatewayAgentConfig(callable="nofunction")
    with pytest.raises(ValueError, match=r"rollout\.backend=hf"):
        RolloutConfig(source="gateway", backend="vllm", gateway=GatewayAgentConfig(command=["x"]))
