"""The build step: one config -> the parts every entry point runs on, with each backend reachable.

The ``openai`` backend is trained and evaluated end to end against ``flowgrpo serve`` on a free
loopback port, serving the same tiny random model the trainer holds."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from flowgrpo.components import Components, build
from flowgrpo.config import ConfigError, load_config
from flowgrpo.env import Environment
from flowgrpo.gateway.serve import make_server, serve_in_thread
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.rollout.backends.base import RolloutBackend
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.rollout.backends.openai import OpenAIBackend
from flowgrpo.rollout.backends.vllm import VLLMUnavailableError
from flowgrpo.runs.rundir import RunDir
from flowgrpo.training.pipeline import evaluate_run
from flowgrpo.training.trainer import Trainer
from tests.toy import FirstTokenEnv, first_token_reward


def reward() -> CompositeReward:
    return CompositeReward([RewardSpec(name="first_token")], fns={"first_token": first_token_reward(0)})


def config(tmp_path, *overrides: str):
    return load_config(
        None,
        [
            "model.name=tiny",
            "model.autocast=null",
            f"run.output_dir={tmp_path / 'run'}",
            "run.progress=false",
            "run.save_every=0",
            "rollout.max_turns=1",
            "rollout.max_new_tokens=2",
            "rollout.scheduling=static",
            "train.tasks_per_step=4",
            "train.group_size=4",
            "train.lr=3e-2",
            *overrides,
        ],
    )


def test_build_makes_every_part_from_the_config(tmp_path):
    parts = build(config(tmp_path, "env.name=arithmetic"))
    assert isinstance(parts, Components)
    assert isinstance(parts.backend, HFBackend) and parts.backend.model is parts.model
    assert isinstance(parts.backend, RolloutBackend)
    env = parts.env_factory()
    assert isinstance(env, Environment) and env.name == "arithmetic" and env.spec.name == "arithmetic"
    assert parts.tasks("train") and parts.tasks("test") and parts.tasks("train") is parts.tasks("train")
    assert [s.name for s in parts.reward.specs] == ["accuracy"]
    assert parts.parser is parts.probe_env.parser
    # the same config builds the same untrained policy
    again = build(config(tmp_path, "env.name=arithmetic"))
    a, b = parts.model.state_dict(), again.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_backend_choice_and_its_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.server\.base_url"):
        config(tmp_path, "rollout.backend=openai")
    with pytest.raises(ConfigError, match="'hf', 'openai' or 'vllm'"):
        config(tmp_path, "rollout.backend=vlm")
    parts = build(
        config(tmp_path, "rollout.backend=openai", "rollout.server.base_url=http://127.0.0.1:9/v1"),
        env_factory=FirstTokenEnv,
        reward=reward(),
    )
    assert isinstance(parts.backend, OpenAIBackend)
    assert parts.backend.base_url == "http://127.0.0.1:9/v1" and parts.backend.model == "tiny"
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(VLLMUnavailableError, match="flowgrpo\\[vllm\\]"):
            build(config(tmp_path, "rollout.backend=vllm"), env_factory=FirstTokenEnv, reward=reward())


@pytest.fixture
def served():
    """``flowgrpo serve``'s server on a free loopback port, over the tiny model seed 0 (the policy
    ``model.name=tiny`` builds with ``train.seed=0``)."""
    model, tok = tiny_model(tiny_tokenizer(), seed=0)
    server = make_server(HFBackend(model, tok), tok, model_name="tiny", host="127.0.0.1", port=0)
    serve_in_thread(server)
    yield server
    server.shutdown()
    server.server_close()


def test_openai_backend_trains_and_evaluates_end_to_end(tmp_path, served, caplog):
    cfg = config(
        tmp_path,
        "rollout.backend=openai",
        f"rollout.server.base_url={served.url}/v1",
        "train.steps=2",
        "algorithm.tis=token",
    )
    tr = Trainer(cfg, env_factory=FirstTokenEnv, reward=reward())
    assert isinstance(tr.parts.backend, OpenAIBackend)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="flowgrpo.rollout.backends.openai"):
        out = tr.train()
    assert out["status"] == "finished" and tr.step == 2
    trajs = RunDir(cfg.run.output_dir).trajectories(1)
    assert len(trajs) == 16
    for t in trajs:  # ids and logprobs came back from the server
        assert t.turns and t.turns[0].action_ids
        assert len(t.turns[0].action_logprobs) == len(t.turns[0].action_ids)
        assert all(math.isfinite(x) and x <= 0 for x in t.turns[0].action_logprobs)
    metrics = [m.values for m in RunDir(cfg.run.output_dir).metrics() if "optimizer_steps" in m.values]
    assert any(m["optimizer_steps"] for m in metrics)
    after = tr.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert caplog.text.count("keeps its own weights") == 1  # the stale-policy warning, said once
    ev = tr.evaluate(n=4, label="served", record=True)
    assert ev.n == 4 and ev.mean_turns == 1.0
    assert RunDir(cfg.run.output_dir).find_eval("served").n == 4


def test_evaluate_run_builds_no_trainer(tmp_path, monkeypatch):
    """``flowgrpo eval`` runs on the built parts with the checkpoint's weights: no optimizer and no
    reference copy."""
    cfg = config(tmp_path, "env.name=arithmetic", "rollout.max_new_tokens=4")
    import flowgrpo.training.trainer as trainer_mod

    def no_trainer(*a, **kw):
        raise AssertionError("evaluate_run must not build a Trainer")

    monkeypatch.setattr(trainer_mod, "Trainer", no_trainer)
    res = evaluate_run(cfg, n=3, checkpoint="untrained", label="untrained", record=True)
    assert res.n == 3 and res.label == "untrained" and res.step == 0
    assert RunDir(cfg.run.output_dir).find_eval("untrained").n == 3


def test_compare_reuses_evaluations_of_every_task_when_the_split_has_fewer_than_n(tmp_path, monkeypatch):
    """multihop has a few hundred test questions at most: evaluations of all of them answer
    ``--compare`` at its default n = 500, with no checkpoint left and no model loaded (a run whose
    checkpoints were pruned)."""
    import flowgrpo.training.pipeline as pipeline
    from flowgrpo.components import env_factory_of
    from flowgrpo.runs.evaluation import EvalResult

    cfg = config(tmp_path, "env.name=multihop")
    ids = [t.id for t in env_factory_of(cfg.env)().tasks("test")]
    assert 50 < len(ids) < 500
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "eval.jsonl", "w") as f:
        for label, step, solved in [("warm", 0, 20), ("step30", 30, 45)]:
            per_task = {t: int(i < solved) for i, t in enumerate(ids)}
            ev = EvalResult(
                label=label, step=step, n=len(ids), accuracy=solved / len(ids), ci95=(0, 1), per_task=per_task
            )
            f.write(ev.model_dump_json() + "\n")

    def no_eval(*a, **kw):
        raise AssertionError("the recorded evaluations cover every test task")

    monkeypatch.setattr(pipeline, "evaluate_run", no_eval)
    c = pipeline.compare_checkpoints(cfg, "warm", "30")["comparison"]
    assert c.n == len(ids) and (c.only_a, c.only_b) == (0, 25)


def test_served_policy_receives_the_trainers_weights_and_reports_its_version(tmp_path, served, caplog):
    """rollout.server.weight_sync_dir: every update is pushed to flowgrpo serve, whose completions
    report the version that sampled them; the trajectories record it."""
    cfg = config(
        tmp_path,
        "rollout.backend=openai",
        f"rollout.server.base_url={served.url}/v1",
        f"rollout.server.weight_sync_dir={tmp_path / 'sync'}",
        "train.steps=3",
        "train.drop_zero_variance_groups=false",  # an update (and a push) every step
        "algorithm.tis=token",
    )
    tr = Trainer(cfg, env_factory=FirstTokenEnv, reward=reward())
    with caplog.at_level(logging.WARNING, logger="flowgrpo.rollout.backends.openai"):
        tr.train()
    assert "keeps its own weights" not in caplog.text
    assert served.policy_version == tr.parts.backend.policy_version == 3
    served_state = served.backend.model.state_dict()
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, served_state[k]), k
    for step in (1, 2, 3):  # the trajectories of step t were sampled by version t - 1
        assert {t.policy_version for t in RunDir(cfg.run.output_dir).trajectories(step)} == {step - 1}
    assert [p.name for p in (tmp_path / "sync").iterdir()] == ["policy_v000003.safetensors"]


@pytest.mark.parametrize(
    ("overrides", "rollout_dtype", "autocast", "expected"),
    [
        ([], None, None, "off"),  # fp32 sampler over the trained weights, fp32 trainer: they agree
        ([], "bfloat16", None, "token"),  # a bf16 inference copy
        ([], None, "bfloat16", "token"),  # autocast on either side
        (["train.async_staleness=1"], None, None, "token"),  # older policies
        (["rollout.backend=openai", "rollout.server.base_url=http://x"], None, None, "token"),
        (["algorithm.tis=off"], "bfloat16", None, "off"),  # an explicit setting is kept
        (["algorithm.tis=sequence_mask"], None, None, "sequence_mask"),
    ],
)
def test_tis_auto_corrects_whenever_sampler_and_trainer_can_disagree(
    overrides, rollout_dtype, autocast, expected
):
    from flowgrpo.components import resolve_tis

    assert resolve_tis(load_config(None, overrides), rollout_dtype, autocast) == expected


def test_the_backend_samples_a_bf16_copy_when_rollout_dtype_says_so(tmp_path):
    model, tok = tiny_model(tiny_tokenizer(), seed=0)
    parts = build(
        load_config(
            None, [f"run.output_dir={tmp_path}", "model.rollout_dtype=bfloat16", "model.autocast=null"]
        ),
        model=model,
        tokenizer=tok,
        env_factory=FirstTokenEnv,
    )
    assert parts.rollout_dtype == "bfloat16" and parts.tis == "token"
    assert isinstance(parts.backend, HFBackend) and parts.backend.inference_dtype == torch.bfloat16
    parts = build(
        load_config(
            None, [f"run.output_dir={tmp_path}", "model.rollout_dtype=float32", "model.autocast=null"]
        ),
        model=model,
        tokenizer=tok,
        env_factory=FirstTokenEnv,
    )
    assert parts.rollout_dtype is None and parts.tis == "off" and parts.backend.inference_dtype is None
