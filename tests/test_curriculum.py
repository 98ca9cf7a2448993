"""Curriculum: pass-rate and stratified task sampling, difficulty stages by step, and exact resume."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.algorithms.curriculum import (
    PairedStream,
    PassRateSampler,
    StratifiedStream,
    TaskStream,
    make_sampler,
    pass_rate_weight,
    weighted_cycle,
)
from flowgrpo.config import ConfigError, load_config
from flowgrpo.env import register
from flowgrpo.runs.rundir import RunDir
from flowgrpo.types import Task, Trajectory, TrajectoryGroup
from tests.toy import EXACT, FirstTokenEnv, make_trainer, params

pytestmark = pytest.mark.usefixtures("one_thread")


class LevelEnv(FirstTokenEnv):
    """FirstTokenEnv whose task ids name the difficulty level it was built with."""

    def __init__(self, level: int = 1) -> None:
        self.level = level

    def tasks(self, split: str) -> list[Task]:
        n = 8 if split == "train" else 4
        return [Task(id=f"L{self.level}-{split}-{i}", prompt=f"task {i} at {self.level}") for i in range(n)]


register("levels_test", LevelEnv)


def tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", prompt=str(i)) for i in range(n)]


def group(task_id: str, rewards: list[float]) -> TrajectoryGroup:
    return TrajectoryGroup(
        task=Task(id=task_id, prompt=""),
        trajectories=[Trajectory(task_id=task_id, reward=r) for r in rewards],
    )


def test_pass_rate_weight_hand_computed():
    assert pass_rate_weight(None, 0.01) == 0.25  # never tried: the most learnable
    assert pass_rate_weight(0.5, 0.01) == 0.25
    assert pass_rate_weight(0.25, 0.01) == 0.1875  # 0.25 * 0.75
    assert pass_rate_weight(0.0, 0.01) == 0.01 and pass_rate_weight(1.0, 0.05) == 0.05


def test_pass_rates_use_the_last_window_episodes_and_skip_excluded():
    s = PassRateSampler(tasks(3), seed=0, window=4)
    s.observe([group("t0", [1, 1, 0]), group("t1", [1, 1])])
    s.observe([group("t0", [0, 0])])  # t0: [1, 1, 0, 0, 0] -> the last 4: [1, 0, 0, 0]
    bad = group("t2", [1.0])
    bad.trajectories[0].excluded = "termination:error"
    s.observe([bad])
    assert s.pass_rate("t0") == 0.25 and s.pass_rate("t1") == 1.0 and s.pass_rate("t2") is None
    assert s.weights() == [0.1875, 0.01, 0.25]


def test_frontier_tasks_are_drawn_in_proportion_to_their_weight():
    s = PassRateSampler(tasks(2), seed=1, floor=0.01)
    s.observe([group("t0", [1, 0]), group("t1", [1, 1])])  # weights 0.25 and 0.01
    n = 4000
    hits = sum(s.next(1)[0].id == "t0" for _ in range(n))
    # P(t0) = 0.25 / 0.26 = 0.9615; 4 binomial standard deviations: +- 0.0122
    assert abs(hits / n - 0.25 / 0.26) < 0.0122
    drawn = s.next(2)
    assert sorted(t.id for t in drawn) == ["t0", "t1"]  # distinct within a call
    assert [t.id for t in s.next(5)].count("t0") >= 2  # more than the list: all, then again


def test_sampler_state_resumes_exactly():
    a = PassRateSampler(tasks(6), seed=3)
    a.observe([group("t1", [1, 0]), group("t4", [1, 1, 1])])
    a.next(3)
    state = a.state_dict()
    b = PassRateSampler(tasks(6), seed=3)
    b.load_state_dict(state)
    assert [t.id for t in a.next(4)] == [t.id for t in b.next(4)]
    a.observe([group("t2", [0])])
    assert state["history"] == {"t1": [1.0, 0.0], "t4": [1.0, 1.0, 1.0]}  # a copy, not a view
    with pytest.raises(ValueError, match=r"same curriculum\.sampler"):
        TaskStream(tasks(2), 0).load_state_dict(state)
    with pytest.raises(ValueError, match=r"same curriculum\.sampler"):
        b.load_state_dict(TaskStream(tasks(2), 0).state_dict())


def test_a_new_stage_restarts_the_stream_and_the_same_stage_keeps_its_place():
    s = TaskStream(tasks(4), seed=0)
    s.next(3)
    s.set_tasks(tasks(4), stage=-1)  # the same stage (a resumed run rebuilding its env)
    assert (s.epoch, s.pos) == (0, 3)
    s.set_tasks(tasks(5), stage=0)
    assert s.state_dict() == {"epoch": 0, "pos": 0, "stage": 0}
    p = PassRateSampler(tasks(2), seed=0)
    p.observe([group("t0", [1])])
    p.set_tasks(tasks(2), stage=0)
    assert p.history == {} and p.stage == 0


def typed(kinds: str) -> list[Task]:
    """One task per character, its metadata ``kind`` the character: ``typed("aab")``."""
    return [Task(id=f"{k}{i}", prompt=str(i), metadata={"kind": k}) for i, k in enumerate(kinds)]


def test_stratified_draws_take_turns_over_the_values():
    s = StratifiedStream(typed("aaaaab"), seed=0, key="kind")  # 5 a, 1 b
    step = s.next(6)
    assert [t.metadata["kind"] for t in step] == list("ababab")  # 3 + 3, however lopsided the list
    assert [t.id for t in step[1::2]] == ["b5"] * 3  # the lone b comes round every other draw
    assert len({t.id for t in step[0::2]}) == 3  # a's stream: distinct within its epoch
    odd = s.next(3) + s.next(3)  # an odd step leaves the turn where it stopped: a b a, then b a b
    assert [t.metadata["kind"] for t in odd] == list("ababab")
    a_ids = [t.id for t in step[0::2] + odd[0::2]]
    assert sorted(a_ids[:5]) == ["a0", "a1", "a2", "a3", "a4"]  # one pass over a's five tasks


def test_stratified_state_resumes_exactly_and_a_new_stage_restarts():
    a = StratifiedStream(typed("aabbbc"), seed=4, key="kind")
    a.next(5)
    state = a.state_dict()
    b = StratifiedStream(typed("aabbbc"), seed=4, key="kind")
    b.load_state_dict(state)
    assert [t.id for t in a.next(7)] == [t.id for t in b.next(7)]
    b.set_tasks(typed("aabbbc"), stage=-1)  # the same stage: the place is kept
    assert b.state_dict() == a.state_dict()
    b.set_tasks(typed("xy"), stage=0)
    assert b.state_dict()["drawn"] == 0 and [t.id for t in b.next(2)] == ["x0", "y1"]
    with pytest.raises(
        ValueError, match=r"same curriculum\.sampler, curriculum\.stratify_by and curriculum\.pair_by"
    ):
        StratifiedStream(typed("ab"), 0, "kind").load_state_dict(TaskStream(tasks(2), 0).state_dict())
    with pytest.raises(ValueError, match=r"stratify_by"):
        TaskStream(tasks(2), 0).load_state_dict(state)


def test_weighted_cycle_spreads_each_value_by_its_share():
    assert weighted_cycle([1, 1, 1]) == [0, 1, 2]  # equal shares: the plain k mod V turn
    assert weighted_cycle([2, 1]) == [0, 1, 0]
    # (3, 1): credits [3,1] -> 0 -> [-1,1]; [2,2] -> 0 (tie, lower index) -> [-2,2]; [1,3] -> 1 -> [1,-1];
    # [4,0] -> 0 -> [0,0]: back where it started, so the cycle repeats exactly
    assert weighted_cycle([3, 1]) == [0, 0, 1, 0]
    assert weighted_cycle([1, 2]) == [1, 0, 1]


def test_stratify_weights_set_each_values_share_of_a_step():
    s = StratifiedStream(typed("aaaaabbb"), seed=0, key="kind", weights={"a": 2, "b": 1})
    assert [t.metadata["kind"] for t in s.next(6)] == list("abaaba")  # 4 + 2 in a step of 6
    assert [t.metadata["kind"] for t in s.next(3)] == list("aba")
    state = s.state_dict()
    resumed = StratifiedStream(typed("aaaaabbb"), seed=0, key="kind", weights={"a": 2, "b": 1})
    resumed.load_state_dict(state)
    assert [t.id for t in resumed.next(5)] == [t.id for t in s.next(5)]
    with pytest.raises(
        ValueError, match=r"cycle \[0, 1, 0\], this config in \[0, 1\]; resume it with the same"
    ):
        StratifiedStream(typed("aaaaabbb"), seed=0, key="kind").load_state_dict(state)
    with pytest.raises(ValueError, match=r"names the values \['a'\], but the training tasks' 'kind' takes"):
        StratifiedStream(typed("ab"), 0, "kind", weights={"a": 1})


def test_stratify_weights_config():
    cfg = load_config(None, ["curriculum.stratify_by=hops", "curriculum.stratify_weights={1: 2, 2: 1}"])
    assert cfg.curriculum.stratify_weights == {"1": 2, "2": 1}  # matched against metadata as text
    hops = [Task(id=f"q{i}", prompt=str(i), metadata={"hops": h}) for i, h in enumerate([1, 2, 1, 2])]
    s = make_sampler(cfg.curriculum, hops, 0)
    assert [t.metadata["hops"] for t in s.next(6)] == [1, 2, 1, 1, 2, 1]  # int values, weighed as text
    with pytest.raises(ConfigError, match=r"stratify_weights weighs the values of curriculum\.stratify_by"):
        load_config(None, ["curriculum.stratify_weights={1: 2}"])
    with pytest.raises(ConfigError, match=r"whole number >= 1, got \{'1': 0\}"):
        load_config(None, ["curriculum.stratify_by=hops", "curriculum.stratify_weights={1: 0}"])


def test_a_list_valued_field_names_its_strata_joined():
    chains = [["city"], ["city", "country"], ["city"], ["year"]]  # e.g. multihop's relation chains
    qs = [Task(id=f"q{i}", prompt=str(i), metadata={"chain": c}) for i, c in enumerate(chains)]
    s = StratifiedStream(qs, seed=0, key="chain", weights={"city": 1, "city > country": 2, "year": 1})
    assert s.values == ["city", "city > country", "year"]
    step = [" > ".join(t.metadata["chain"]) for t in s.next(4)]  # the cycle 1 0 2 1 over the sorted names
    assert step == ["city > country", "city", "year", "city > country"]


def test_stratify_by_names_a_field_every_task_carries():
    with pytest.raises(ValueError, match=r"training task 't0' has no metadata field 'kind' \(it has \[\]\)"):
        StratifiedStream(tasks(2), 0, "kind")
    cfg = load_config(None, ["curriculum.stratify_by=kind"]).curriculum
    assert isinstance(make_sampler(cfg, typed("ab"), 0), StratifiedStream)
    assert isinstance(make_sampler(load_config(None, []).curriculum, typed("ab"), 0), TaskStream)
    with pytest.raises(ConfigError, match=r"with curriculum\.sampler=pass_rate drop stratify_by"):
        load_config(None, ["curriculum.sampler=pass_rate", "curriculum.stratify_by=kind"])


def subjects(spec: str) -> list[Task]:
    """Tasks q0, q1, ... whose ``first`` field is the letter of ``spec`` at their index."""
    return [Task(id=f"q{i}", prompt=str(i), metadata={"first": c}) for i, c in enumerate(spec)]


def test_paired_draws_follow_each_task_with_one_that_shares_the_field():
    qs = subjects("xxyzzz")  # x: q0 q1; y: q2 alone; z: q3 q4 q5
    base = TaskStream(qs, seed=3)
    order = [t.id for t in TaskStream(qs, seed=3).next(6)]  # the base stream's own order
    s = PairedStream(base, qs, seed=3, key="first")
    step = s.next(6)
    firsts = [t.metadata["first"] for t in step]
    anchors, k = [], 0
    while k < len(step):  # each anchor is followed by a partner with its value, except the lone y
        anchors.append(step[k].id)
        if firsts[k] == "y":
            k += 1
            continue
        if k + 1 < len(step):
            assert firsts[k + 1] == firsts[k] and step[k + 1].id != step[k].id
        k += 2
    assert anchors == order[: len(anchors)]  # anchors come from the base stream, in its order
    assert len(step) == 6  # a partner that would be the 7th is left out
    assert base.state_dict()["pos"] == len(anchors)


def test_paired_partners_hand_checked_and_resume_exactly():
    qs = subjects("xxyy")  # each task has exactly one partner: q0-q1, q2-q3
    order = [t.id for t in TaskStream(qs, seed=0).next(8)]  # the base stream: two epochs
    assert order == ["q2", "q0", "q1", "q3", "q3", "q0", "q2", "q1"]
    s = PairedStream(TaskStream(qs, seed=0), qs, seed=0, key="first")
    assert [t.id for t in s.next(4)] == ["q2", "q3", "q0", "q1"]  # anchor, its partner, anchor, partner
    assert [t.id for t in s.next(1)] == ["q1"]  # a step of one holds its anchor alone
    # anchor q3 brings q2; the base's next draw, q3 again, is already in the step and passed over
    # for q0, whose partner would be the 4th of a step of 3
    assert [t.id for t in s.next(3)] == ["q3", "q2", "q0"]
    state = s.state_dict()
    assert state["paired"] == 5 and set(state["base"]) == {"epoch", "pos", "stage"}
    resumed = PairedStream(TaskStream(qs, seed=0), qs, seed=0, key="first")
    resumed.load_state_dict(state)
    assert [t.id for t in resumed.next(7)] == [t.id for t in s.next(7)]
    with pytest.raises(
        ValueError, match=r"not paired by 'first'; resume it with the same curriculum\.pair_by"
    ):
        resumed.load_state_dict(TaskStream(qs, 0).state_dict())
    with pytest.raises(ValueError, match=r"pair_by"):
        TaskStream(qs, 0).load_state_dict(state)


def test_pair_by_wraps_the_configured_stream_and_names_a_missing_field():
    cfg = load_config(None, ["curriculum.stratify_by=hops", "curriculum.pair_by=first"]).curriculum
    qs = [Task(id=f"q{i}", prompt=str(i), metadata={"hops": 1 + i % 2, "first": i // 2}) for i in range(8)]
    s = make_sampler(cfg, qs, 0)
    assert isinstance(s, PairedStream) and isinstance(s.base, StratifiedStream)
    step = s.next(8)  # anchors from the stratified stream, each followed by its one partner
    assert step[0].metadata["hops"] == 1 and len({t.id for t in step}) == 8
    assert [t.metadata["first"] for t in step[0::2]] == [t.metadata["first"] for t in step[1::2]]
    assert sorted(t.metadata["hops"] for t in step) == [1] * 4 + [2] * 4
    with pytest.raises(ValueError, match=r"pair_by='first': training task 't0' has no metadata field"):
        make_sampler(cfg.model_copy(update={"stratify_by": None}), tasks(2), 0)


def test_config_validation():
    cfg = load_config(None, [])
    assert cfg.curriculum.sampler == "uniform" and cfg.curriculum.difficulty == []  # today's default
    c = load_config(
        None,
        [
            "curriculum.difficulty=[{from_step: 0, env_kwargs: {difficulty: 1}}, "
            "{from_step: 5, env_kwargs: {difficulty: 2}}]"
        ],
    ).curriculum
    assert [c.stage_at(s) for s in (0, 4, 5, 99)] == [0, 0, 1, 1]
    assert (
        load_config(None, ["curriculum.difficulty=[{from_step: 3, env_kwargs: {a: 1}}]"]).curriculum.stage_at(
            2
        )
        == -1
    )
    with pytest.raises(ConfigError, match="strictly increasing from_step"):
        load_config(
            None,
            [
                "curriculum.difficulty=[{from_step: 5, env_kwargs: {a: 1}}, {from_step: 2, env_kwargs: {a: 2}}]"
            ],
        )
    with pytest.raises(ConfigError, match=r"curriculum\.sampler"):
        load_config(None, ["curriculum.sampler=hardest"])
    with pytest.raises(ConfigError, match=r"curriculum\.floor"):
        load_config(None, ["curriculum.floor=0.5"])
    with pytest.raises(ConfigError, match=r"curriculum\.difficulty\.0\.env_kwargs"):
        load_config(None, ["curriculum.difficulty=[{from_step: 1, env_kwargs: {}}]"])


CURRICULUM = (
    EXACT,
    "env.name=levels_test",
    "curriculum.sampler=pass_rate",
    "curriculum.difficulty=[{from_step: 2, env_kwargs: {level: 2}}]",
    "train.steps=4",
    "run.save_every=1",
)


def task_ids(run, step: int) -> list[str]:
    return sorted({t.task_id for t in RunDir(run).trajectories(step)})


def test_curriculum_and_difficulty_resume_exactly(tmp_path):
    straight = make_trainer(tmp_path, *CURRICULUM, name="straight")
    straight.train()
    first = make_trainer(tmp_path, *CURRICULUM, name="split")
    first.train(until_step=3)  # stops inside the second stage
    del first
    resumed = make_trainer(tmp_path, *CURRICULUM, "run.resume=true", name="split")
    assert resumed.step == 3
    resumed.train()
    assert straight.stream.state_dict() == resumed.stream.state_dict()
    for step in (1, 2, 3, 4):
        assert task_ids(tmp_path / "straight", step) == task_ids(tmp_path / "split", step), step
    # steps 0 and 1: the env the trainer was given; from step index 2 on: levels_test(level=2)
    assert all(t.startswith("train-") for t in task_ids(tmp_path / "straight", 2))
    assert all(t.startswith("L2-") for t in task_ids(tmp_path / "straight", 3))
    for k, v in params(straight.model).items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
