"""Debug modes: rollout-only saves a step's trajectories without an update; update-only replays a
saved step into one update and reproduces the loss terms the run recorded."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.cli import main
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.runs.rundir import RunDir, RunError
from flowgrpo.training.debug import groups_of, rollout_only, update_only
from tests.toy import EXACT, FirstTokenEnv, first_token_reward, make_trainer, params

pytestmark = pytest.mark.usefixtures("one_thread")


def pieces() -> dict:
    """The same parts make_trainer builds (seed-0 tiny model), fresh."""
    model, tok = tiny_model(tiny_tokenizer(), seed=0)
    reward = CompositeReward(
        [RewardSpec(name="first_token")], fns={"first_token": first_token_reward(len(tok))}
    )
    return {"model": model, "tokenizer": tok, "env_factory": FirstTokenEnv, "reward": reward}


def test_update_only_reproduces_the_recorded_update(tmp_path):
    tr = make_trainer(tmp_path, EXACT, "train.steps=2", "run.save_every=1", "train.minibatches_per_batch=2")
    tr.train()
    recorded = {m.step: m.values for m in RunDir(tmp_path / "run").metrics() if "loss" in m.values}
    for step in (1, 2):  # step 1 from the initial model, step 2 from the checkpoint of step 1
        rep = update_only(tmp_path / "run", step, **pieces())
        assert rep.terms["optimizer_steps"] == recorded[step]["optimizer_steps"] == 2.0
        for k in ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean", "grad_norm", "train_tokens"):
            assert rep.terms[k] == pytest.approx(recorded[step][k], rel=1e-5, abs=1e-7), (step, k)
            assert rep.recorded[k] == recorded[step][k]
        assert "replayed" in rep.summary() and "pg_loss" in rep.summary()
    # nothing was written into the run
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "checkpoints",
        "config.yaml",
        "metrics.jsonl",
        "trajectories",
    ]


def test_update_only_overrides_change_the_update(tmp_path):
    make_trainer(tmp_path, EXACT, "train.steps=1", "run.save_every=1").train()
    base = update_only(tmp_path / "run", 1, **pieces())
    no_kl = update_only(tmp_path / "run", 1, ["algorithm.kl_coef=0"], **pieces())
    assert "kl" in base.terms and "kl" not in no_kl.terms


def test_rollout_only_saves_a_step_and_updates_nothing(tmp_path):
    tr = make_trainer(tmp_path, EXACT, "train.steps=5")
    before = params(tr.model)
    rep = rollout_only(tr)
    assert rep.step == 1 and rep.path == tmp_path / "run" / "trajectories" / "step_000001.jsonl"
    assert tr.step == 0 and all(torch.equal(before[k], v) for k, v in params(tr.model).items())
    assert not (tmp_path / "run" / "checkpoints").exists()
    trajs = RunDir(tmp_path / "run").trajectories(1)
    assert len(trajs) == 4 * 6 and all(t.turns[0].advantage is not None for t in trajs)
    groups = groups_of(trajs)
    assert len(groups) == 4 and all(len(g.trajectories) == 6 for g in groups)
    assert rep.groups_sampled == 4 and rep.stats["episodes"] == 24.0
    assert "no update" in rep.summary()
    with pytest.raises(RunError, match="never overwrites"):
        rollout_only(tr)
    # the saved rollout replays into an update from the initial model
    up = update_only(tmp_path / "run", 1, **pieces())
    assert up.checkpoint.startswith("the initial model") and up.recorded == {}
    assert up.terms["optimizer_steps"] == (1.0 if rep.groups_trainable else 0.0)


def test_update_only_errors_name_what_is_missing(tmp_path):
    make_trainer(tmp_path, EXACT, "train.steps=3", "run.save_every=0").train()  # one checkpoint: step 3
    with pytest.raises(RunError, match=r"no trajectories saved for step 7 .* saved steps: 1-3"):
        update_only(tmp_path / "run", 7, **pieces())
    with pytest.raises(RunError, match=r"no checkpoint of step 2 .* steps that can be replayed: 1"):
        update_only(tmp_path / "run", 3, **pieces())
    with pytest.raises(RunError, match="steps start at 1"):
        update_only(tmp_path / "run", 0, **pieces())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--update-only", "RUN"], "--update-only needs --step N"),
        (["train", "cfg.yaml", "--update-only", "RUN", "--step", "1"], "takes no CONFIG"),
        (["train", "cfg.yaml", "--rollout-only", "--step", "1"], "--step belongs to --update-only"),
        (["train"], "needs a CONFIG"),
    ],
)
def test_cli_debug_flags_are_checked(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_update_only_on_a_missing_run(tmp_path, capsys):
    assert main(["train", "--update-only", str(tmp_path / "nope"), "--step", "1"]) == 2
    assert "is not a directory" in capsys.readouterr().err
