"""Checkpoints hold what resume needs and no more; an unreadable or vanished checkpoint is never
silently replaced by a fresh start."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from flowgrpo.modeling.models import tiny_model
from flowgrpo.runs.checkpoint import (
    _HEADROOM,
    CheckpointError,
    CheckpointWriteError,
    latest_checkpoint,
    load_checkpoint,
    policy_state_dict,
    read_checkpoint,
    save_checkpoint,
)
from tests.toy import EXACT, make_trainer, params

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tied_weights_are_stored_once_and_load_back_exactly(tmp_path):
    model, _ = tiny_model()
    state = policy_state_dict(model)
    assert "lm_head.weight" not in state and "model.embed_tokens.weight" in state  # tied: one copy
    path = save_checkpoint(tmp_path, 3, model=model)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(state)
    other, _ = tiny_model(seed=1)
    assert load_checkpoint(path, model=other)["step"] == 3
    for k, v in model.state_dict().items():
        assert torch.equal(v, other.state_dict()[k]), k
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()


def test_a_checkpoint_holds_policy_optimizer_and_a_reference_pointer_not_a_copy(tmp_path):
    tr = make_trainer(tmp_path, "train.steps=1", "run.save_every=1")
    assert tr.ref_model is not None  # kl_coef > 0: the reference exists, and is not saved
    tr.train()
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.safetensors", "optimizer.pt", "state.pt"]
    n_params = sum(p.numel() for p in tr.model.parameters())  # tied weights counted once
    policy_bytes = (ckpt / "model.safetensors").stat().st_size
    assert n_params * 4 <= policy_bytes < n_params * 4 + 64_000  # fp32 tensors plus a JSON header
    # AdamW's two moments: twice the policy, plus per-tensor step counters and pickle framing
    assert 2 * n_params * 4 <= (ckpt / "optimizer.pt").stat().st_size < 2 * n_params * 4 + 200_000
    assert (ckpt / "state.pt").stat().st_size < 100_000  # step, scheduler, RNG, stream, pointer
    data = read_checkpoint(ckpt)
    assert data.reference is not None and data.reference.kind == "initial"
    assert data.reference.model == tr.cfg.model.name


def test_resume_after_a_warm_start_points_to_the_warm_reference_and_is_exact(tmp_path, monkeypatch):
    def fake_warm_start(parts):  # a deterministic "supervised" change of the weights
        with torch.no_grad():
            for p in parts.model.parameters():
                p.mul_(1.01)
        return []

    monkeypatch.setattr("flowgrpo.training.sft.warm_start", fake_warm_start)
    common = (EXACT, "train.steps=2", "run.save_every=1", "sft.enabled=true")
    straight = make_trainer(tmp_path, *common, name="straight")
    straight.train()
    first = make_trainer(tmp_path, *common, name="split")
    first.train(until_step=1)
    warm_ref = params(first.ref_model)
    del first
    root = tmp_path / "split" / "checkpoints"
    assert (root / "reference" / "model.safetensors").is_file()
    assert read_checkpoint(root / "step_000001").reference.kind == "file"
    resumed = make_trainer(tmp_path, *common, "run.resume=true", name="split")
    assert resumed.step == 1
    for k, v in params(resumed.ref_model).items():
        assert torch.equal(v, warm_ref[k]), k
    resumed.train()
    a, b = params(straight.model), params(resumed.model)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_an_unreadable_latest_checkpoint_is_one_line_and_falls_back_only_when_allowed(tmp_path):
    common = ("train.steps=2", "run.save_every=1")
    make_trainer(tmp_path, *common).train()
    broken = tmp_path / "run" / "checkpoints" / "step_000002" / "model.safetensors"
    broken.write_bytes(b"")  # a full disk or a crash outside the atomic write
    with pytest.raises(CheckpointError) as err:
        make_trainer(tmp_path, *common, "run.resume=true")
    msg = str(err.value)
    assert "\n" not in msg and str(broken) in msg and "run.resume_fallback=true" in msg
    assert "step_000001" in msg
    tr = make_trainer(tmp_path, *common, "run.resume=true", "run.resume_fallback=true")
    assert tr.step == 1


def test_a_run_whose_checkpoints_vanished_refuses_to_restart_into_its_logs(tmp_path):
    import shutil

    common = ("train.steps=1", "run.save_every=1")
    make_trainer(tmp_path, *common).train()
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    with pytest.raises(CheckpointError, match=r"run\.start_over=true"):
        make_trainer(tmp_path, *common, "run.resume=true")
    tr = make_trainer(tmp_path, *common, "run.resume=true", "run.start_over=true")
    assert tr.step == 0
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    moved = list((tmp_path / "run").glob("discarded-*"))
    assert len(moved) == 1 and (moved[0] / "metrics.jsonl").is_file()
    assert (moved[0] / "trajectories" / "step_000001.jsonl").is_file()


def _no_room(monkeypatch, free: int) -> None:
    import shutil
    from types import SimpleNamespace

    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=10**12, used=0, free=free))


def test_a_disk_too_full_for_the_next_checkpoint_says_so_before_writing_and_keeps_the_last(
    tmp_path, monkeypatch
):
    model, _ = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()  # two moments per parameter: the optimizer state is twice the policy
    first = save_checkpoint(tmp_path, 1, model=model, optimizer_state=optimizer.state_dict())
    policy_bytes = sum(t.numel() * t.element_size() for t in policy_state_dict(model).values())
    # room for the policy and its moments (3x) less one byte, plus the fixed headroom for headers
    _no_room(monkeypatch, free=_HEADROOM + 3 * policy_bytes - 1)
    with pytest.raises(CheckpointWriteError) as err:
        save_checkpoint(tmp_path, 2, model=model, optimizer_state=optimizer.state_dict())
    msg = str(err.value)
    assert "\n" not in msg and "step_000002" in msg and "not enough free space" in msg
    assert f"the latest complete checkpoint, {first}, is intact" in msg and "run.resume=true" in msg
    assert latest_checkpoint(tmp_path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001"]  # no partial directory
    assert save_checkpoint(tmp_path, 2, model=model).name == "step_000002"  # the policy alone fits


def test_a_write_that_fails_midway_names_the_cause_and_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    model, _ = tiny_model()

    def full_disk(obj, path):  # what torch.save raises when the disk fills under it
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1024 vs 977")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError) as err:
        save_checkpoint(tmp_path, 1, model=model)
    msg = str(err.value)
    assert "\n" not in msg and "unexpected pos 1024" in msg and "there is no earlier checkpoint" in msg
    assert latest_checkpoint(tmp_path) is None and list(tmp_path.iterdir()) == []
