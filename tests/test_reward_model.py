"""The reward_model reward with a tiny randomly initialised sequence classifier saved to disk here."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.rewards import CompositeReward, RewardSpec, make_reward
from flowgrpo.types import Message, Task, Trajectory, TrajectoryGroup, Turn
from flowgrpo.utils.aio import run_sync
from tests.stand_ins import save_reward_model


def _group(texts) -> TrajectoryGroup:
    trajs = [
        Trajectory(
            turns=[
                Turn(
                    prompt_ids=[1],
                    action_ids=[2],
                    action_logprobs=[-1.0],
                    action=Message(role="assistant", content=t),
                )
            ]
        )
        for t in texts
    ]
    return TrajectoryGroup(task=Task(id="t", prompt="What is 2 + 2?"), trajectories=trajs)


def _score(rm, g):
    return run_sync(rm.ascore_group(g))


TEXTS = ["<answer>4</answer>", "I think it is five, so <answer>5</answer>", "no idea"]


def test_scalar_head_batched_equals_one_by_one_and_is_cached(tmp_path):
    path, model, tok = save_reward_model(tmp_path, 1, "scalar")
    rm = make_reward("reward_model", path=str(path), batch_size=2)
    g = _group(TEXTS)
    scores = _score(rm, g)
    alone = [_score(make_reward("reward_model", path=str(path), batch_size=1), _group([t]))[0] for t in TEXTS]
    assert scores == pytest.approx(alone, abs=1e-5) and len(set(scores)) == 3
    # the value is the classifier's logit on the rendered task + transcript
    text = rm.text(g.trajectories[0], g.task)
    with torch.no_grad():
        direct = model.eval()(
            input_ids=torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        ).logits[0, 0]
    assert scores[0] == pytest.approx(float(direct), abs=1e-5)
    # cached by trajectory id: a changed model does not re-score the same episodes
    with torch.no_grad():
        rm.model.score.weight.zero_()
    assert _score(rm, g) == scores and set(rm.cache) == {t.id for t in g.trajectories}


def test_label_probability_and_normalisations(tmp_path):
    path, _, _ = save_reward_model(tmp_path, 3, "three")
    with pytest.raises(ValueError, match="pass label="):
        make_reward("reward_model", path=str(path))
    with pytest.raises(ValueError, match="unknown label"):
        make_reward("reward_model", path=str(path), label="good")
    probs = _score(make_reward("reward_model", path=str(path), label="class2"), _group(TEXTS))
    assert all(0 < p < 1 for p in probs)
    assert _score(make_reward("reward_model", path=str(path), label=2), _group(TEXTS)) == pytest.approx(probs)
    raw = _score(make_reward("reward_model", path=str(save_reward_model(tmp_path, 1, "s")[0])), _group(TEXTS))
    sig = _score(make_reward("reward_model", path=str(tmp_path / "s"), normalize="sigmoid"), _group(TEXTS))
    assert sig == pytest.approx([1 / (1 + math.exp(-r)) for r in raw])
    grp = _score(make_reward("reward_model", path=str(tmp_path / "s"), normalize="group"), _group(TEXTS))
    mean = sum(raw) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in raw) / 2)
    assert grp == pytest.approx([(r - mean) / std for r in raw], abs=1e-5)
    g = _group(TEXTS)
    CompositeReward(
        [RewardSpec(name="reward_model", kwargs={"path": str(tmp_path / "s"), "normalize": "running"})]
    ).score_groups([g])
    assert [t.reward for t in g.trajectories] == pytest.approx(
        grp, abs=1e-5
    )  # first batch: the same z-scores
