"""Config: YAML + dotted overrides, and errors that say how to fix them."""

from __future__ import annotations

import json
import math

import pytest

from flowgrpo.config import ConfigError, TrainConfig, dump_config, load_config, parse_override
from flowgrpo.runs.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from flowgrpo.runs.metrics import MetricsLogger
from flowgrpo.runs.rundir import RunDir
from flowgrpo.training.trainer import TaskStream, lr_lambda
from flowgrpo.types import Task


def test_yaml_plus_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(
        "model: {name: tiny, autocast: null}\n"
        "env: {name: arithmetic, kwargs: {max_operand: 20}}\n"
        "rewards: [{name: accuracy}, {name: format, weight: 0.2}]\n"
        "algorithm: {estimator: gigpo, estimator_kwargs: {gamma: 0.9}}\n"
        "train: {lr: 1.0e-5, group_size: 8}\n"
        "rollout: {max_turns: 3, sampling: {temperature: 0.7}}\n"
    )
    cfg = load_config(
        p, ["train.lr=2e-5", "rewards.1.weight=0.5", "algorithm.dual_clip=3", "run.resume=true"]
    )
    assert cfg.train.lr == 2e-5 and cfg.train.group_size == 8
    assert cfg.rewards[1].name == "format" and cfg.rewards[1].weight == 0.5
    assert cfg.env.kwargs == {"max_operand": 20}
    assert cfg.algorithm.estimator == "gigpo" and cfg.algorithm.estimator_kwargs == {"gamma": 0.9}
    assert cfg.algorithm.dual_clip == 3.0 and cfg.run.resume is True
    assert cfg.rollout.max_turns == 3 and cfg.rollout.sampling.temperature == 0.7
    assert cfg.model.autocast is None
    # round trip
    dump_config(cfg, tmp_path / "out.yaml")
    assert load_config(tmp_path / "out.yaml") == cfg


def test_unknown_keys_suggest_the_closest_name():
    with pytest.raises(ConfigError, match=r"did you mean 'train.lr'\?.*valid keys here: .*group_size"):
        load_config(None, ["train.lrr=1e-5"])
    with pytest.raises(ConfigError, match=r"did you mean 'train'"):
        load_config(None, ["trian.steps=3"])
    with pytest.raises(ConfigError, match=r"rollout.sampling.temperature"):
        load_config(None, ["rollout.sampling.temprature=1"])
    with pytest.raises(ConfigError, match=r"did you mean 'gigpo'"):
        load_config(None, ["algorithm.estimator=gipgo"])
    with pytest.raises(ConfigError, match=r"train.lr: Input should be a valid number"):
        load_config(None, ["train.lr=fast"])
    with pytest.raises(ConfigError, match=r"greater than 0"):
        load_config(None, ["train.lr=0"])
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override("train.lr")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/x.yaml")
    with pytest.raises(ConfigError, match="minibatches_per_batch"):
        load_config(None, ["train.tasks_per_step=1", "train.group_size=2", "train.minibatches_per_batch=3"])


def test_override_values_are_yaml():
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=hello") == (["a"], "hello")


def test_list_overrides_index_append_and_say_what_went_wrong():
    cfg = load_config(
        "examples/search_agent.yaml", ["rewards.1.weight=0.2", "rewards.2={name: turn_cost, weight: 0.05}"]
    )
    assert [(r.name, r.weight) for r in cfg.rewards] == [
        ("accuracy", 1.0),
        ("format", 0.2),
        ("turn_cost", 0.05),
    ]
    with pytest.raises(
        ConfigError, match=r"rewards is a list of 2 item\(s\): index it with 0..1; rewards.2=VALUE appends"
    ):
        load_config("examples/search_agent.yaml", ["rewards.5={name: turn_cost}"])
    with pytest.raises(ConfigError, match=r"index it with 0..1, or set the whole list"):
        load_config("examples/search_agent.yaml", ["rewards.2.weight=1"])
    with pytest.raises(ConfigError, match="rewards is a list"):
        load_config("examples/search_agent.yaml", ["rewards.format.weight=1"])


def test_defaults():
    cfg = TrainConfig()
    assert (
        cfg.model.dtype == "float32" and cfg.model.autocast == "auto"
    )  # fp32 master (+ bf16 autocast where fast)
    assert cfg.algorithm.clip_high >= cfg.algorithm.clip_low


def test_task_stream_is_resumable():
    tasks = [Task(id=str(i), prompt="p") for i in range(5)]
    a = TaskStream(tasks, seed=3)
    seq = [t.id for t in a.next(12)]
    assert sorted(seq[:5]) == [str(i) for i in range(5)]  # each pass is a permutation
    b = TaskStream(tasks, seed=3)
    b.next(7)
    c = TaskStream(tasks, seed=3)
    c.load_state_dict(b.state_dict())
    assert [t.id for t in c.next(5)] == seq[7:12]


def test_lr_schedules():
    assert [lr_lambda("constant", 10, 2, 0.0)(s) for s in (0, 1, 5)] == [0.5, 1.0, 1.0]
    assert lr_lambda("linear", 10, 0, 0.0)(5) == pytest.approx(0.5)
    assert lr_lambda("cosine", 10, 0, 0.1)(10) == pytest.approx(0.1)
    assert lr_lambda("cosine", 10, 0, 0.0)(0) == pytest.approx(1.0)


def test_checkpoint_roundtrip_and_pruning(tmp_path):
    import torch

    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    for s in (1, 2, 3):
        save_checkpoint(tmp_path, s, model=m, optimizer_state=opt.state_dict(), extra={"x": s}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002", "step_000003"]
    assert latest_checkpoint(tmp_path).name == "step_000003"
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    save_checkpoint(tmp_path, 4, model=m, optimizer_state=opt.state_dict())
    m2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=0.1)
    torch.manual_seed(123)
    state = load_checkpoint(latest_checkpoint(tmp_path), model=m2, optimizer=opt2)
    assert state["step"] == 4 and torch.equal(m2.weight, m.weight)
    assert torch.equal(torch.rand(3), expected)  # RNG restored
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing", model=m2)


def test_metrics_jsonl(tmp_path):
    log = MetricsLogger(tmp_path / "metrics.jsonl")
    log.log(1, {"a": 1.0, "b": float("nan")})
    log.log(2, {"a": 2.0})
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "a": 1.0, "b": "nan"}, {"step": 2, "a": 2.0}]
    back = RunDir(tmp_path).metrics()  # read back typed: the NaN is a float again
    assert [(m.step, m.values["a"]) for m in back] == [(1, 1.0), (2, 2.0)]
    assert math.isnan(back[0].values["b"]) and "b" not in back[1].values


# Every ConfigError path: (how to provoke it, what the one line must name). The message names the
# offending keys, their values and the fix; a section or the whole config is never echoed back.
CONFIG_ERRORS = [
    (
        ["train.async_staleness=1", "algorithm.tis=off"],
        "train.async_staleness=1 trains on samples of older policies: set algorithm.tis=token",
    ),
    (
        ["rollout.backend=openai"],
        "rollout.backend=openai needs the server's address: set rollout.server.base_url",
    ),
    (["train.group_size=1"], "train.group_size=1 leaves every episode alone"),
    (
        ["train.minibatches_per_batch=1000"],
        "train.minibatches_per_batch=1000 exceeds the trajectories per step",
    ),
    (["algorithm.overlong.buffer_len=100000"], "algorithm.overlong.buffer_len=100000 must be smaller"),
    (
        ["algorithm.ppo.value_model_path=x", "algorithm.ppo.value_model=shared"],
        "algorithm.ppo.value_model_path='x' initialises a separate critic, but algorithm.ppo.value_model=shared",
    ),
    (
        ["algorithm.dual_clip=3", "algorithm.loss=gspo"],
        "algorithm.dual_clip=3.0 applies to algorithm.loss=ppo_clip",
    ),
    (
        ["train.resample_rounds=2", "train.drop_zero_variance_groups=false"],
        "train.resample_rounds=2 refills groups dropped for equal rewards, but train.drop_zero_variance_groups=false",
    ),
    (["algorithm.turn_discount=0.5", "algorithm.name=ppo"], "set algorithm.turn_discount=null"),
    (["algorithm.turn_discount=0.5", "algorithm.estimator=rloo"], "not 'rloo'"),
    (
        ["algorithm.turn_discount=0.5", "algorithm.estimator_kwargs={turn_discount: 0.5}"],
        "keep algorithm.turn_discount only",
    ),
    (["algorithm.estimator=foo"], "algorithm.estimator: unknown advantage estimator 'foo'"),
    (["algorithm.exclude_terminations=[finished]"], "algorithm.exclude_terminations: excluding 'finished'"),
    (
        ["curriculum.difficulty=[{from_step: 2, env_kwargs: {a: 1}}, {from_step: 1, env_kwargs: {a: 2}}]"],
        "curriculum.difficulty stages must have strictly increasing from_step, got [2, 1]",
    ),
    (["curriculum.difficulty=[{from_step: 1}]"], "curriculum.difficulty.0.env_kwargs: Field required"),
    (["agent.executor.source=model"], "agent.executor: source=model needs the model"),
    (["agent.verifier.source=server"], "agent.verifier: source=server needs the endpoint"),
    (["run.tensorboard=true"], "run.tensorboard was replaced by run.log_to"),
    (["train.lrr=1e-5"], "train.lrr: unknown key; did you mean 'train.lr'?"),
    (["model.autocast=bf16"], "model.autocast: Input should be 'auto', 'bfloat16' or 'float16' (got 'bf16')"),
    (
        ["model=smollm2-135m"],
        "model is a section, not a value (got 'smollm2-135m'): set one of its keys (model.KEY=VALUE)",
    ),
    (["model.lora=true"], "model.lora is a section, not a value (got True)"),
    (["rewards=3"], "rewards: Input should be a valid list (got 3)"),
    (
        ["env.kwargs.text=" + "x" * 5000, "env.kwargs=5"],
        "env.kwargs: Input should be a valid dictionary (got 5)",
    ),
    (
        ["run.output_dir=[" + ", ".join(["averyveryverylongname"] * 50) + "]"],
        "run.output_dir: Input should be a valid string (got ['averyvery",
    ),
    (
        ["train.lr=-1", "train.steps=0"],
        "invalid configuration (2 errors): train.steps: Input should be greater",
    ),
    (["train.lr"], "must look like section.key=value"),
    (["=3"], "has an empty key"),
    (["train.lr=[1,"], "the value is not valid YAML (line 1, column 4: expected the node content"),
    (["train.lr.x=1"], "train.lr is a value, not a section"),
    (["rewards.x=1"], "rewards is a list of 1 item(s): index it with 0..0; rewards.1=VALUE appends one"),
    (["rewards.5.weight=1"], "rewards is a list of 1 item(s): index it with 0..0, or set the whole list"),
]


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


@pytest.mark.parametrize(
    ("overrides", "expected"), CONFIG_ERRORS, ids=[" ".join(o)[:40] for o, _ in CONFIG_ERRORS]
)
def test_every_config_error_is_one_short_line(overrides, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    msg = str(e.value)
    assert "\n" not in msg and expected in msg, msg
    # the key, its value and the fix (an unknown key lists its section's keys); never a dumped section
    assert len(msg) <= 400, (len(msg), msg)
    assert "{'" not in msg, msg


def test_file_errors_are_one_short_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [1, 2\n  steps: 3\n" + "# padding\n" * 200)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    cases = [
        (tmp_path / "nope.yaml", "does not exist"),
        (
            bad,
            f"{bad} is not valid YAML: line 3, column 8: expected ',' or ']', but got ':' (while parsing a flow sequence)",
        ),
        (empty, f"{empty} is empty: write the sections you change"),
        (listed, f"{listed} must hold a mapping of sections"),
    ]
    for path, expected in cases:
        with pytest.raises(ConfigError) as e:
            load_config(path)
        msg = str(e.value)
        assert "\n" not in msg and expected in msg and len(msg) <= 320 + len(str(path)), msg


def test_run_directory_and_environment_errors_are_one_short_line(tmp_path):
    from flowgrpo.components import check_env_name
    from flowgrpo.runs.rundir import RunError

    (tmp_path / "config.yaml").write_text("train:\n  group_size: 1\n")
    with pytest.raises(RunError) as e:  # a saved config this version rejects: the reason, not the config
        RunDir(tmp_path).config()
    assert "train.group_size=1 leaves every episode alone" in str(e.value) and "{'" not in str(e.value)
    assert len(_one_line(e.value)) <= 320 + len(str(tmp_path)), str(e.value)
    (tmp_path / "config.yaml").write_text("- a\n")
    with pytest.raises(RunError, match=r"config\.yaml does not hold a mapping of sections"):
        RunDir(tmp_path).config()
    with pytest.raises(ConfigError) as e:
        check_env_name("arithmetik")
    assert "did you mean 'arithmetic'?" in str(e.value) and len(str(e.value)) <= 400, str(e.value)
