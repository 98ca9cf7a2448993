"""Dynamic loss scaling for a float16 update: the schedule, the underflow it prevents, the trainer's
use of it, and its place in a checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.runs.checkpoint import read_checkpoint, resume_candidates
from flowgrpo.runs.rundir import RunDir
from flowgrpo.training.loss_scale import INIT_SCALE, DynamicLossScale, loss_scale_for
from tests.toy import make_trainer, params

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_scale_halves_on_an_overflow_and_doubles_after_the_growth_interval():
    s = DynamicLossScale(True, init_scale=8.0, growth_interval=2)
    assert float(s.scale(torch.tensor(0.5))) == 4.0
    s.update(found_inf=False)
    assert (s.scale_value, s.clean_steps) == (8.0, 1)
    s.update(found_inf=False)  # the second clean step in a row: 8 -> 16
    assert (s.scale_value, s.clean_steps) == (16.0, 0)
    s.update(found_inf=False)
    s.update(found_inf=True)  # an overflow halves the scale and restarts the count
    assert (s.scale_value, s.clean_steps, s.overflows) == (8.0, 0, 1)
    s.update(found_inf=True)
    assert (s.scale_value, s.overflows) == (4.0, 2)

    w = torch.nn.Parameter(torch.zeros(2))
    w.grad = torch.tensor([4.0, -2.0])
    s.unscale_([w, torch.nn.Parameter(torch.zeros(1))])  # a parameter without a gradient is skipped
    assert w.grad.tolist() == [1.0, -0.5]

    restored = DynamicLossScale(True, init_scale=1.0, growth_interval=2)
    restored.load_state_dict(s.state_dict())
    assert restored.state_dict() == {"scale": 4.0, "clean_steps": 0, "overflows": 2}


def test_only_a_float16_update_is_scaled():
    assert loss_scale_for("float16").scale_value == INIT_SCALE == 2.0**16
    for autocast in (None, "bfloat16"):
        off = loss_scale_for(autocast)
        loss = torch.tensor(0.25)
        assert not off.enabled and off.scale(loss) is loss
        g = torch.nn.Parameter(torch.zeros(1))
        g.grad = torch.tensor([3.0])
        off.unscale_([g])
        off.update(found_inf=True)
        assert g.grad.item() == 3.0 and off.scale_value == 1.0 and off.overflows == 0


def test_scaling_keeps_gradients_that_fp16_would_flush_to_zero():
    """A loss weight of 1e-9 (a token's share of a large batch, times a small advantage) gives every
    fp16 output a gradient of 1e-9, below fp16's smallest subnormal (2**-24 = 6.0e-8): unscaled it
    is 0. Scaled by 2**16 it is 6.55e-5, representable; unscaled again in fp32 the weight's
    gradient is the exact one, 4 rows x 1e-9 = 4e-9 per element."""
    x = torch.ones(4, 3)

    def weight_grad(scaler: DynamicLossScale) -> torch.Tensor:
        lin = torch.nn.Linear(3, 2, bias=False)
        with torch.autocast("cpu", dtype=torch.float16):
            out = lin(x)  # (4, 2) fp16
        assert out.dtype == torch.float16
        scaler.scale(out.float().sum() * 1e-9).backward()
        scaler.unscale_(lin.parameters())
        return lin.weight.grad

    assert torch.count_nonzero(weight_grad(DynamicLossScale(False))) == 0
    kept = weight_grad(DynamicLossScale(True))
    assert kept.dtype == torch.float32
    assert torch.allclose(kept, torch.full((2, 3), 4e-9), rtol=1e-3)


def test_a_float16_update_trains_and_its_scale_survives_a_resume(tmp_path):
    common = ("model.autocast=float16", "model.rollout_dtype=float16", "train.steps=2", "run.save_every=1")
    tr = make_trainer(tmp_path, *common)
    before = params(tr.model)
    out = tr.train(until_step=1)
    assert out["status"] in ("finished", "stopped") and tr.step == 1
    after = params(tr.model)
    assert all(v.dtype == torch.float32 for v in after.values())  # fp32 master weights
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert tr.scaler.enabled and tr.scaler.scale_value <= INIT_SCALE
    assert tr.scaler.clean_steps + tr.scaler.overflows >= 1  # every optimizer step updated the schedule
    logged = [m.values for m in RunDir(tmp_path / "run").metrics() if "loss_scale" in m.values]
    assert [m["loss_scale"] for m in logged] == [tr.scaler.scale_value]

    ckpt = read_checkpoint(resume_candidates(tmp_path / "run" / "checkpoints")[0])
    assert ckpt.state["extra"]["loss_scale"] == tr.scaler.state_dict()
    resumed = make_trainer(tmp_path, *common, "run.resume=true")
    assert resumed.step == 1 and resumed.scaler.state_dict() == tr.scaler.state_dict()


def test_the_fp32_path_reports_no_loss_scale(tmp_path):
    tr = make_trainer(tmp_path, "train.steps=1", "run.save_every=1")
    tr.train()
    assert not tr.scaler.enabled
    ckpt = read_checkpoint(resume_candidates(tmp_path / "run" / "checkpoints")[0])
    assert "loss_scale" not in ckpt.state["extra"]


@pytest.mark.parametrize("grad", [math.inf, math.nan])
def test_a_float16_overflow_skips_the_step_and_halves_the_scale(tmp_path, grad, monkeypatch):
    """An overflowing gradient is what fp16 scaling expects now and then: the optimizer step is
    skipped (weights untouched) and the next step runs at half the scale."""
    tr = make_trainer(tmp_path, "model.autocast=float16", "train.steps=1", "run.save_every=0")
    real_unscale = tr.scaler.unscale_

    def overflowing(ps):
        ps = list(ps)
        real_unscale(ps)
        ps[0].grad.view(-1)[0] = grad

    monkeypatch.setattr(tr.scaler, "unscale_", overflowing)
    before = params(tr.model)
    tr.train()
    assert tr.scaler.overflows >= 1 and tr.scaler.scale_value == INIT_SCALE / 2**tr.scaler.overflows
    assert tr.counters["nan_skipped_steps"] == tr.scaler.overflows
    assert all(torch.equal(before[k], v) for k, v in params(tr.model).items())
