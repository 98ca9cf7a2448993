"""Every example runs in a smoke setting: the YAML configs through ``flowgrpo train`` (tiny random
model, one step) and the Python examples through their ``main()``.

The smoke overrides (documented in examples/README.md) keep the real config's env, rewards and
algorithm and only shrink the model and the budget, so a broken config key or env setting fails here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from flowgrpo.cli import main as cli_main
from flowgrpo.modeling.models import tiny_tokenizer
from flowgrpo.runs.store import read_trajectories

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMOKE = [
    "model.name=tiny",
    "model.autocast=null",
    "train.steps=1",
    "train.tasks_per_step=2",
    "train.group_size=2",
    "train.drop_zero_variance_groups=false",  # a random model's groups tie: still run the update
    "train.resample_rounds=0",
    "rollout.max_new_tokens=16",
    "sft.tasks=4",
    "sft.epochs=1",
    "run.progress=false",
]
# Oracle demonstrations of a search or a whole function do not fit in 16 tokens: no warm start there,
# so nothing to replay either (the calculator config covers the warm-start path).
EXTRA = {
    "calculator_agent": [],
    "search_agent": ["sft.enabled=false", "sft.replay_coef=0"],
    "code_agent": ["sft.enabled=false"],
}


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _check_token_ids(traj, tok) -> None:
    """The stored ids are what the model saw and sampled: each action decodes to its text, and the
    opening prompt decodes to the rendered system + user messages."""
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    first = tok.decode(traj.turns[0].prompt_ids, skip_special_tokens=False)
    assert first.startswith("<|im_start|>system\n") and "<|im_start|>user\n" in first
    assert first.endswith("<|im_start|>assistant\n")
    for k, turn in enumerate(traj.turns):
        assert len(turn.action_ids) == len(turn.action_logprobs) > 0
        assert all(0 <= i < len(tok) for i in turn.prompt_ids + turn.action_ids)
        body = turn.action_ids[:-1] if turn.action_ids[-1] == eot else turn.action_ids
        assert tok.decode(body, skip_special_tokens=False) == turn.action.content
        ctx = traj.context_ids(k)
        assert ctx[-len(turn.prompt_ids) :] == turn.prompt_ids
        if k + 1 < len(traj.turns):
            assert traj.context_ids(k + 1)[: len(ctx) + len(turn.action_ids)] == ctx + turn.action_ids


@pytest.mark.parametrize("name", ["calculator_agent", "search_agent", "code_agent"])
def test_yaml_example_trains_one_step(name, tmp_path):
    sets = [a for kv in [*SMOKE, *EXTRA[name], f"run.output_dir={tmp_path}"] for a in ("--set", kv)]
    assert cli_main(["train", str(EXAMPLES / f"{name}.yaml"), *sets, "--eval-n", "2", "--no-report"]) == 0
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rl = [m for m in metrics if m["step"] == 1 and "episodes" in m]
    assert rl and rl[-1]["episodes"] == 4.0 and "loss" in rl[-1]  # 2 tasks x 2, and an update ran
    evals = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    warm = [("warm", 2)] if "sft.enabled=false" not in EXTRA[name] else []  # eval after the warm start
    assert [(e["label"], e["n"]) for e in evals] == [("untrained", 2), *warm, ("step1", 2)]
    assert all(len(e["per_task"]) == 2 and len(e["ci95"]) == 2 for e in evals)  # paired tests need these
    assert (tmp_path / "checkpoints" / "step_000001" / "state.pt").is_file()
    trajs = read_trajectories(tmp_path / "trajectories" / "step_000001.jsonl")
    assert len(trajs) == 4
    tok = tiny_tokenizer()
    for t in trajs:
        _check_token_ids(t, tok)
    cfg_env = (tmp_path / "config.yaml").read_text()
    expected_env = {"calculator_agent": "arithmetic", "search_agent": "multihop", "code_agent": "coding"}[
        name
    ]
    assert f"name: {expected_env}" in cfg_env
    if name == "calculator_agent":
        _check_compare_and_failures(tmp_path)


def _check_compare_and_failures(run):
    """`flowgrpo eval RUN --compare` reuses the recorded evaluations (same tasks, paired test), and
    the failure taxonomy classifies every recorded held-out episode."""
    import contextlib
    import io

    from benchmarks.failures import CLASSES
    from benchmarks.failures import main as failures_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli_main(["eval", str(run), "--compare", "warm", "1", "--n", "2"]) == 0
    out = buf.getvalue()
    assert "on the same 2 tasks" in out and "McNemar exact p =" in out
    # an unknown side is a usage error (exit 2, the fix in the message), not a traceback
    assert cli_main(["eval", str(run), "--compare", "best", "1", "--n", "2"]) == 2
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert failures_main([str(run), "untrained", "step1"]) == 0
    rows = [line.split() for line in buf.getvalue().splitlines()]
    assert [r[0] for r in rows] == list(CLASSES)
    assert sum(int(r[1]) for r in rows) == 2 and sum(int(r[3]) for r in rows) == 2


def test_custom_tool_example_rolls_out():
    out = _load_example("custom_tool").main(["--max-new-tokens", "16"])
    [scripted] = [t for g in out["scripted"] for t in g.trajectories][:1]
    # the scripted policy called the @tool, read "1.25"-style output, and answered correctly
    assert scripted.termination.value == "finished" and scripted.reward_breakdown["accuracy"] == 1.0
    assert scripted.turns[0].observations[0].name == "unit_price"
    tok = tiny_tokenizer()
    for t in [t for g in out["scripted"] + out["sampled"] for t in g.trajectories]:
        _check_token_ids(t, tok)
    assert len([t for g in out["sampled"] for t in g.trajectories]) == 4


def test_langchain_tool_example_rolls_out(capsys):
    mod = _load_example("langchain_tool")
    from langchain_core.tools import BaseTool

    assert isinstance(mod.convert_lc, BaseTool)  # a real langchain-core tool, adapted
    out = mod.main(["--max-new-tokens", "16"])
    assert "cannot convert mass (kg) to length (m)" in capsys.readouterr().out  # ToolException -> observation
    demos = [t for g in out["demos"] for t in g.trajectories]
    assert all(t.reward_breakdown["accuracy"] == 1.0 for t in demos)
    assert all(t.turns[0].observations[0].name == "convert" for t in demos)
    assert out["stats"]["episodes"] == 4
    tok = tiny_tokenizer()
    for t in demos + [t for g in out["groups"] for t in g.trajectories]:
        _check_token_ids(t, tok)


def test_custom_env_example_runs():
    import subprocess

    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_env.py")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "the oracle solved 20/20 test tasks" in r.stdout


def test_train_with_a_bad_config_key_exits_2_and_names_the_fix(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["train", str(EXAMPLES / "calculator_agent.yaml"), "--set", "train.lrr=1e-5"])
    assert exc.value.code == 2
    assert "did you mean 'train.lr'" in capsys.readouterr().err


def _smoke_gsm8k(name: str, out: Path, *extra: str) -> list[dict]:
    """One step of a GSM8K recipe at smoke settings; returns the RL step's metrics lines."""
    sets = [*SMOKE, "sft.enabled=false", *extra, f"run.output_dir={out}"]
    args = [a for kv in sets for a in ("--set", kv)]
    assert cli_main(["train", str(EXAMPLES / f"{name}.yaml"), *args, "--eval-n", "2", "--no-report"]) == 0
    assert "name: gsm8k" in (out / "config.yaml").read_text()
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [m for m in metrics if m["step"] == 1 and "episodes" in m]


def test_gsm8k_diversity_recipe_trains_one_step(tmp_path):
    # group_size 3: with two responses both are equally far from their mean, so diversity is 0
    [rl] = _smoke_gsm8k("gsm8k_diversity", tmp_path, "train.group_size=3")
    assert rl["episodes"] == 6.0 and "loss" in rl
    trajs = read_trajectories(tmp_path / "trajectories" / "step_000001.jsonl")
    assert all(set(t.reward_breakdown) == {"format", "accuracy", "diversity"} for t in trajs)
    for k in range(2):  # min-max in each group: its least similar response 1, its most similar 0
        div = sorted(t.reward_breakdown["diversity"] for t in trajs[3 * k : 3 * k + 3])
        assert div[0] == 0.0 and div[-1] == 1.0


@pytest.fixture
def judge_server():
    """``flowgrpo serve``'s server over the tiny random model on a free loopback port."""
    from flowgrpo.gateway.serve import make_server, serve_in_thread
    from flowgrpo.modeling.models import tiny_model
    from flowgrpo.rollout.backends.hf import HFBackend

    model, tok = tiny_model(tiny_tokenizer(), seed=0)
    server = make_server(HFBackend(model, tok), tok, model_name="tiny", host="127.0.0.1", port=0)
    serve_in_thread(server)
    yield server
    server.shutdown()
    server.server_close()


def test_gsm8k_quality_recipe_asks_the_served_judge(tmp_path, judge_server):
    """The judge's request reaches `flowgrpo serve` and its reply comes back: a random model's reply
    holds no 1-5 score, so every episode is excluded by the judge with that reason (never a crash)."""
    judge = [f"rewards.2.kwargs.base_url={judge_server.url}/v1", "rewards.2.kwargs.model=tiny"]
    [rl] = _smoke_gsm8k("gsm8k_quality", tmp_path, *judge)
    assert rl["episodes"] == 4.0 and rl["episodes_excluded"] == 4.0
    trajs = read_trajectories(tmp_path / "trajectories" / "step_000001.jsonl")
    assert all(t.excluded.startswith("reward:judge: judge: reply has no score") for t in trajs)
    assert all(set(t.reward_breakdown) == {"accuracy", "format"} for t in trajs)  # the parts that scored
    from benchmarks.judge_rubric import main as judge_rubric

    out = judge_rubric([str(tmp_path / "trajectories" / "step_000001.jsonl"), "--n", "4", "--judge", "tiny"])
    assert (out["n"], out["scored"], out["right_answers"]) == (4, 0, 0)
