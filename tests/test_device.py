"""``model.device``: one resolver, and every tensor of a step created on the model's device.

These run on the CPU. A CPU-only machine has one device, so a tensor built on the wrong one cannot
be seen by comparing devices; instead the builders are given the ``meta`` device (which every torch
has) and must create everything there, and spies check that every caller passes the model's device
to them. The same checks on a real GPU are in ``tests/test_gpu.py`` (``make test-gpu``).
"""

from __future__ import annotations

import pytest
import torch

from flowgrpo.config import ConfigError, TrainConfig, load_config
from flowgrpo.modeling import hardware
from flowgrpo.modeling.hardware import resolve_device
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
from flowgrpo.rewards import CompositeReward
from flowgrpo.rewards.base import _REWARDS, register_reward
from flowgrpo.training import batching, sft, trainer, value
from flowgrpo.training.batching import Row, collate, micro_batches
from tests.device_check import inputs_on_model_device, trainer_models
from tests.toy import make_trainer

pytestmark = pytest.mark.usefixtures("one_thread")

META = torch.device("meta")


# ------------------------------------------------------------------ the resolver
def test_auto_is_the_default_and_means_the_cpu_without_cuda():
    assert TrainConfig().model.device == "auto"
    assert load_config(None, ["model.device=null"]).model.device == "auto"  # configs of older runs
    assert resolve_device("auto") == resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize(("setting", "hint"), [("gpu", "'cuda'"), ("cude", "'cuda'"), ("CPU", "'cpu'")])
def test_a_misspelt_device_names_the_closest(setting, hint):
    with pytest.raises(ConfigError, match=f"unknown device '{setting}'; did you mean {hint}"):
        load_config(None, [f"model.device={setting}"])


@pytest.mark.parametrize("setting", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_says_how_to_get_one(setting):
    with pytest.raises(ConfigError) as e:
        resolve_device(setting)
    msg = str(e.value)
    assert f"model.device={setting}" in msg and "set model.device=cpu (or auto)" in msg
    if torch.version.cuda is None:  # this CPU build: install a CUDA one
        assert "has no CUDA" in msg and "TORCH_SPEC" in msg and "scripts/bootstrap.sh" in msg


def test_with_gpus_auto_is_cuda_an_index_is_honoured_and_torchrun_takes_the_local_rank(monkeypatch):
    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"cuda:2 does not exist: this machine sees 2 GPU\(s\)"):
        resolve_device("cuda:2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="under torchrun: every rank uses its own GPU"):
        resolve_device("cuda:0")
    monkeypatch.setenv("LOCAL_RANK", "2")  # more ranks than GPUs
    with pytest.raises(ConfigError, match="at most one rank per GPU"):
        resolve_device("auto")


# ------------------------------------------------------------------ builders create on the device
def _rows() -> list[Row]:
    return [
        Row([5, 6, 7, 8, 9], [0, 0, 1, 1, 1], [0, 0, 0.5, 0.5, 0.5], [0, 0, -1, -1, -1], [0] * 5, 0, "a"),
        Row([5, 6, 7], [0, 1, 1], [0, -1.0, -1.0], [0, -2, -2], [0, 0, 0], 1, "b"),
        Row([5, 6, 7, 8], [0, 0, 1, 1], [0, 0, 2.0, 2.0], [0, 0, -3, -3], [0, 0, 1, 1], 2, "c"),
    ]


def _tensors(mb: batching.MicroBatch) -> dict[str, torch.Tensor]:
    return {k: v for k, v in mb.__dict__.items() if isinstance(v, torch.Tensor)}


def test_micro_batches_are_created_on_the_requested_device():
    rows = _rows()
    for kw in ({}, {"weights_over": [*rows, Row([1, 2], [0, 1], [0, 1.0], [0, -1], [0, 0], 3, "d")]}):
        mbs = micro_batches(rows, 8, device=META, **kw)
        assert len(mbs) > 1  # several micro-batches, each built on the device
        for mb in mbs:
            ts = _tensors(mb)
            assert set(ts) == {f for f in batching.MicroBatch.__dataclass_fields__ if f != "rows"}
            assert all(t.device == META for t in ts.values()), {k: t.device for k, t in ts.items()}
            assert mb.device == META


def test_the_device_changes_where_not_what():
    rows = _rows()
    for agg in ("token_mean", "seq_mean_token_mean", "turn_mean"):
        plain = micro_batches(rows, 8, agg=agg)
        placed = micro_batches(rows, 8, agg=agg, device="cpu")
        for a, b in zip(plain, placed, strict=True):
            for k, t in _tensors(a).items():
                assert torch.equal(t, _tensors(b)[k]), k
    mb = collate(rows, pad_id=3, device=META)
    assert all(t.device == META for t in _tensors(mb).values())
    ref = collate(rows, pad_id=3)
    assert ref.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 3, 3], [5, 6, 7, 8, 3]]
    assert ref.attention_mask.tolist() == [[1] * 5, [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]
    assert ref.turn_index.dtype == ref.input_ids.dtype == torch.long and ref.loss_mask.dtype == torch.float32


# ------------------------------------------------------------------ every caller passes the model's device
@pytest.fixture
def spies(monkeypatch):
    """Wrap the builders where the trainer, the warm start and the critic call them: each call
    must name the model's device (on the CPU, a forgotten ``device=`` would pass unseen)."""
    seen: list[tuple[str, object]] = []

    def spy(module, name):
        real = getattr(module, name)

        def wrapped(*args, **kw):
            seen.append((f"{module.__name__}.{name}", kw.get("device")))
            return real(*args, **kw)

        monkeypatch.setattr(module, name, wrapped)

    spy(trainer, "micro_batches")
    spy(sft, "micro_batches")
    spy(value, "collate")
    return seen


@pytest.mark.parametrize(
    "overrides",
    [
        ("algorithm.tis=token", "algorithm.entropy_top_q=0.5"),  # the reference, old and entropy passes
        ("algorithm.name=ppo", "algorithm.ppo.value_model=separate"),  # the critic and GAE
        ("algorithm.name=ppo", "algorithm.ppo.value_model=shared"),
    ],
)
def test_every_pass_of_a_step_builds_on_the_models_device(tmp_path, spies, overrides):
    tr = make_trainer(tmp_path, "train.steps=1", "run.save_every=0", *overrides)
    assert tr.device == tr.parts.device == next(tr.model.parameters()).device
    with inputs_on_model_device(*trainer_models(tr)) as check:
        m = tr.train_step()
    assert m["optimizer_steps"] == 1.0 and check.calls > 0
    callers = {name for name, _ in spies}
    assert "flowgrpo.training.trainer.micro_batches" in callers
    if "algorithm.name=ppo" in overrides:
        assert "flowgrpo.training.value.collate" in callers
    assert all(dev == tr.device for _, dev in spies), spies


def test_the_warm_start_builds_on_the_models_device(tmp_path, spies):
    tr = make_trainer(tmp_path, "train.steps=1")

    class Say:
        async def act(self, messages):
            return "The answer is 19."

    demos = sft.demonstrations(tr.parts, 2, policy=Say())
    with inputs_on_model_device(tr.model) as check:
        sft.supervised_epochs(tr.parts, demos, epochs=1)
    assert check.calls > 0
    assert spies and all(
        name == "flowgrpo.training.sft.micro_batches" and dev == tr.device for name, dev in spies
    )


def test_the_device_hook_catches_an_input_on_another_device():
    model, _ = tiny_model(tiny_tokenizer())
    with (
        pytest.raises(AssertionError, match="on another device than their model"),
        inputs_on_model_device(model),
    ):
        model.model.embed_tokens(torch.ones(1, 2, dtype=torch.long, device=META))
    with inputs_on_model_device(model) as check:
        model(input_ids=torch.ones(1, 3, dtype=torch.long))
    assert check.calls > 0 and not check.problems


# ------------------------------------------------------------------ the parts built around the policy
def test_a_passed_in_model_stays_under_auto_and_moves_to_an_explicit_device(tmp_path):
    from flowgrpo.components import build

    model, tok = tiny_model(tiny_tokenizer())
    cfg = load_config(None, ["model.name=tiny", "env.name=arithmetic", f"run.output_dir={tmp_path}"])
    assert build(cfg, model=model, tokenizer=tok).device == torch.device("cpu")
    cfg.model.device = "cpu"
    assert build(cfg, model=model, tokenizer=tok).device == torch.device("cpu")
    cfg.model.device = "cuda"
    with pytest.raises(ConfigError, match=r"model\.device=cuda"):
        build(cfg, model=model, tokenizer=tok)


def test_model_loading_rewards_default_to_the_policys_device():
    got: list[object] = []

    def factory(device=None, **kw):
        got.append(device)
        return lambda traj, task: 0.0

    register_reward("places_a_model", factory, places_model=True)
    register_reward("places_none", lambda **kw: (got.append(kw.get("device")), lambda t, k: 0.0)[1])
    try:
        CompositeReward([{"name": "places_a_model"}, {"name": "places_none"}], device="cuda:1")
        CompositeReward([{"name": "places_a_model", "kwargs": {"device": "cpu"}}], device="cuda:1")
        CompositeReward([{"name": "places_a_model"}])
    finally:
        _REWARDS.pop("places_a_model")
        _REWARDS.pop("places_none")
    assert got == ["cuda:1", None, "cpu", None]


def test_the_verifier_and_reward_model_run_on_their_models_device(tmp_path):
    from flowgrpo.rewards.verifier import HFVerifier

    model, tok = tiny_model(tiny_tokenizer())
    v = HFVerifier(model, tok, batch_size=2)
    with inputs_on_model_device(model) as check:
        pairs = v.probabilities(
            [[{"role": "user", "content": "1 + 1 = 2?"}], [{"role": "user", "content": "x"}]]
        )
    assert len(pairs) == 2 and check.calls > 0
    assert all(0.0 <= y <= 1.0 and 0.0 <= n <= 1.0 for y, n in pairs)
