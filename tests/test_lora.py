"""LoRA through peft: only adapters train, the reference is the base with adapters off (no copy),
resume is exact, the merged model gives the same logprobs as base + adapters."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.modeling.logprobs import action_logprobs
from flowgrpo.modeling.lora import LoraSpec, apply_lora, is_lora, merged_model, reference_mode
from flowgrpo.modeling.models import tiny_model
from flowgrpo.runs.checkpoint import POLICY_FILE, CheckpointError, load_policy_state, policy_state_dict
from tests.toy import EXACT, make_trainer, params

pytest.importorskip("peft")

LORA = "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj, up_proj]}"


pytestmark = pytest.mark.usefixtures("one_thread")


def base_and_adapters(model) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    ps = params(model)
    return ({k: v for k, v in ps.items() if "lora_" not in k}, {k: v for k, v in ps.items() if "lora_" in k})


def logprobs_of(model, ids: torch.Tensor) -> torch.Tensor:
    mask = torch.ones_like(ids)
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, 3:] = 1
    with torch.no_grad():
        return action_logprobs(model, ids, mask, loss_mask)[0]  # (B, T)


def test_lora_steps_change_only_the_adapters_and_the_reference_is_the_base(tmp_path):
    tr = make_trainer(tmp_path, LORA, EXACT, "train.steps=3", "run.save_every=0")
    assert is_lora(tr.model) and tr.ref_model is tr.model  # no second copy
    opt_params = {id(p) for g in tr.optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for n, p in tr.model.named_parameters() if "lora_" in n}
    base0, lora0 = base_and_adapters(tr.model)
    tr.train()
    base1, lora1 = base_and_adapters(tr.model)
    assert base0.keys() == base1.keys() and all(torch.equal(base0[k], base1[k]) for k in base0)
    assert any(not torch.equal(lora0[k], lora1[k]) for k in lora0 if "lora_B" in k)
    # the reference: adapters off == the untouched base model (same seed)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    base_model, _ = tiny_model(seed=0)
    with reference_mode(tr.ref_model) as ref:
        ref_lp = logprobs_of(ref, ids)
    assert torch.equal(ref_lp, logprobs_of(base_model, ids))
    assert not torch.allclose(logprobs_of(tr.model, ids), ref_lp)  # adapters back on afterwards


def test_lora_resume_is_exact(tmp_path):
    common = (LORA, EXACT, "train.steps=3", "run.save_every=1", "train.minibatches_per_batch=2")
    straight = make_trainer(tmp_path, *common, name="straight")
    straight.train()
    first = make_trainer(tmp_path, *common, name="split")
    first.train(until_step=1)
    del first
    resumed = make_trainer(tmp_path, *common, "run.resume=true", name="split")
    assert resumed.step == 1
    resumed.train()
    a, b = params(straight.model), params(resumed.model)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the checkpoint holds the adapters only
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "split" / "checkpoints" / "step_000003" / POLICY_FILE))
    assert saved and all("lora_" in k for k in saved)
    assert sum(v.numel() for v in saved.values()) == sum(
        p.numel() for p in resumed.model.parameters() if p.requires_grad
    )


def test_policy_state_of_a_lora_model_is_its_adapters(tmp_path):
    model, _ = tiny_model(seed=0)
    peft_model = apply_lora(model, LoraSpec(r=2, target_modules=["q_proj"]))
    state = policy_state_dict(peft_model)
    assert state and all("lora_" in k for k in state)
    assert sum(v.numel() for v in state.values()) == sum(
        p.numel() for p in peft_model.parameters() if p.requires_grad
    )
    with pytest.raises(CheckpointError, match="adapters only"):
        load_policy_state(tiny_model(seed=0)[0], state, source=tmp_path)
    with pytest.raises(CheckpointError, match=r"same model\.lora"):
        other = apply_lora(tiny_model(seed=0)[0], LoraSpec(r=2, target_modules=["v_proj"]))
        load_policy_state(other, state, source=tmp_path)
    with pytest.raises(ValueError, match="matches no layer"):
        apply_lora(tiny_model(seed=0)[0], LoraSpec(target_modules=["no_such_proj"]))


def test_merged_model_gives_the_logprobs_of_base_plus_adapters(tmp_path):
    tr = make_trainer(tmp_path, LORA, "train.steps=2", "run.save_every=0")
    tr.train()
    merged = merged_model(tr.model)
    assert not is_lora(merged) and is_lora(tr.model)  # a copy: the policy keeps its adapters
    assert not any("lora_" in k for k in merged.state_dict())
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(logprobs_of(merged, ids), logprobs_of(tr.model, ids), atol=1e-5, rtol=0)
    out = tmp_path / "merged"
    merged.save_pretrained(out)
    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(logprobs_of(again, ids), logprobs_of(tr.model, ids), atol=1e-5, rtol=0)


def test_export_of_a_lora_run_writes_the_merged_plain_model(tmp_path):
    """``flowgrpo export RUN OUT`` on a LoRA run: a plain transformers model (no adapters) with the
    policy's logprobs."""
    from transformers import AutoModelForCausalLM

    from flowgrpo.cli import main

    tr = make_trainer(tmp_path, LORA, "model.name=tiny", "train.steps=2", "run.save_every=0")
    tr.train()
    out = tmp_path / "exported"
    assert main(["export", str(tmp_path / "run"), str(out)]) == 0
    plain = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora_" in k for k in plain.state_dict())
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(logprobs_of(plain, ids), logprobs_of(tr.model, ids), atol=1e-5, rtol=0)
