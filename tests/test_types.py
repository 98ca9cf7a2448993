import pytest
from pydantic import ValidationError

from flowgrpo.types import Message, Task, Termination, ToolCall, Trajectory, TrajectoryGroup, Turn


def _turn(prompt, action, reset=False):
    return Turn(
        prompt_ids=prompt,
        action_ids=action,
        action_logprobs=[-0.5] * len(action),
        action=Message(role="assistant", content="x"),
        resets_context=reset,
    )


def test_context_is_reconstructed_from_linear_storage():
    traj = Trajectory(turns=[_turn([1, 2, 3], [4, 5]), _turn([6], [7]), _turn([8, 9], [10])])
    assert traj.context_ids(0) == [1, 2, 3]
    assert traj.context_ids(1) == [1, 2, 3, 4, 5, 6]
    assert traj.context_ids(2) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # Linear in tokens: every token is stored exactly once.
    assert traj.num_tokens == 10
    assert traj.num_action_tokens == 4


def test_resets_context_starts_a_fresh_context():
    traj = Trajectory(turns=[_turn([1, 2], [3]), _turn([20, 21], [22], reset=True), _turn([23], [24])])
    assert traj.context_ids(1) == [20, 21]
    assert traj.context_ids(2) == [20, 21, 22, 23]


def test_logprobs_must_match_actions():
    with pytest.raises(ValidationError, match="one logprob per sampled token"):
        Turn(prompt_ids=[1], action_ids=[2, 3], action_logprobs=[0.0], action=Message(role="assistant"))


def test_unknown_fields_and_roles_are_rejected():
    with pytest.raises(ValidationError):
        Message(role="robot", content="hi")
    with pytest.raises(ValidationError):
        Task(id="t", prompt="p", answr="4")


def test_round_trip_json_and_chat_dict():
    call = ToolCall(name="calculator", arguments={"expression": "2+2"})
    msg = Message(role="assistant", content="", tool_calls=[call])
    traj = Trajectory(turns=[_turn([1], [2])], termination=Termination.max_turns, reward=1.0)
    back = Trajectory.model_validate_json(traj.model_dump_json())
    assert back == traj and back.termination is Termination.max_turns
    d = msg.to_chat_dict()
    assert d["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "2+2"}}
    group = TrajectoryGroup(task=Task(id="t1", prompt="2+2?", answer="4"), trajectories=[traj, traj])
    assert group.rewards == [1.0, 1.0]
