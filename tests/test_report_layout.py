"""The report leads with the key metrics, keeps the warm start off the step axis, labels ticks
readably for any range, keeps legends off the data, and shows gold answers and why episodes ended."""

from __future__ import annotations

import re

from flowgrpo.runs.report import (
    ended_text,
    is_warm_start_row,
    metric_order,
    nice_ticks,
    svg_line_chart,
    tick_labels,
    trajectory_html,
)
from flowgrpo.types import Message, Termination, Trajectory, Turn


def test_ticks_of_a_ratio_near_one_are_all_different():
    ticks = nice_ticks(0.99991, 1.00008, 5)
    assert ticks == [0.9999, 0.99995, 1.0, 1.00005, 1.0001]
    assert tick_labels(ticks) == ["1-1.0e-04", "1-5.0e-05", "1", "1+5.0e-05", "1+1.0e-04"]
    assert tick_labels([0.9, 0.95, 1.0]) == ["0.90", "0.95", "1.00"]
    labels = tick_labels(nice_ticks(0.9999775, 0.9999875, 5))
    assert len(set(labels)) == len(labels) == 4
    assert tick_labels([0, 50, 100]) == ["0", "50", "100"]
    assert tick_labels([0.0, 0.25, 0.5]) == ["0.00", "0.25", "0.50"]  # a 2.5 step needs 2 decimals
    assert tick_labels([1e6, 2e6, 3e6]) == ["1.0e+06", "2.0e+06", "3.0e+06"]
    assert tick_labels([0.9999995, 0.9999996, 0.9999997]) == ["1-5.0e-07", "1-4.0e-07", "1-3.0e-07"]
    assert tick_labels([1.8e-05, 2e-05, 2.2e-05]) == ["1.80e-05", "2.00e-05", "2.20e-05"]


def test_the_legend_sits_below_the_plot_box():
    svg = svg_line_chart({"a": [(1, 0.0), (2, 1.0)], "b": [(1, 1.0), (2, 0.0)]}, title="t", height=260)
    assert 'height="288"' in svg  # 260 + one 14 px legend row per series
    legend_y = [float(y) for y in re.findall(r'<text x="74" y="([\d.]+)" class="legend"', svg)]
    assert len(legend_y) == 2 and min(legend_y) > 260 - 34  # below the plot box (bottom margin 34)


def test_key_metrics_lead_and_the_rest_is_grouped():
    names = [
        "step",
        "time/step_s",
        "lr",
        "grad_norm",
        "termination/max_tokens",
        "reward_mean",
        "kl",
        "eval/accuracy",
    ]
    order = metric_order(names)
    assert order[0] == ("key metrics", ["reward_mean", "kl", "grad_norm"])
    assert dict(order[1:]) == {
        "held-out evaluation": ["eval/accuracy"],
        "timing": ["time/step_s"],
        "update": ["lr"],
        "rollout": ["termination/max_tokens"],
    }
    assert is_warm_start_row({"step": 0, "sft/loss": 1.0, "sft/epoch": 0})
    assert not is_warm_start_row({"step": 1, "reward_mean": 0.5})


def test_an_episode_shows_its_gold_answer_and_why_it_ended():
    turn = Turn(
        prompt_ids=[1, 2],
        action_ids=[3],
        action_logprobs=[-0.1],
        action=Message(role="assistant", content="<answer>41</answer>"),
        finish_reason="length",
    )
    traj = Trajectory(
        id="t0", group_id="g", task_id="k", env="e", turns=[turn], termination=Termination.max_tokens
    )
    page = trajectory_html(traj, None, scale=1.0, gold="42")
    assert (
        'final answer: <span class="answer">41</span>' in page
        and 'gold answer: <span class="gold">42</span>' in page
    )
    assert "ended: max_tokens: the last action hit rollout.max_new_tokens" in page
    assert ended_text(traj).startswith("max_tokens")
