"""The trainer -> served policy weight handoff (flowgrpo.modeling.weightsync, flowgrpo serve's /v1/load_weights)."""

from __future__ import annotations

import httpx
import pytest
import torch

from flowgrpo.gateway.serve import make_server, serve_in_thread
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
from flowgrpo.modeling.weightsync import WeightSyncError, load_weights, write_weights
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.rollout.backends.openai import OpenAIBackend, OpenAIBackendError


@pytest.fixture
def served():
    model, tok = tiny_model(tiny_tokenizer(), seed=0)
    server = make_server(HFBackend(model, tok), tok, model_name="tiny", host="127.0.0.1", port=0)
    serve_in_thread(server)
    yield server
    server.shutdown()
    server.server_close()


def test_write_then_load_copies_every_tensor_in_place(tmp_path):
    src, _ = tiny_model(seed=1)
    dst, _ = tiny_model(seed=2)
    embed = dst.model.embed_tokens.weight
    path = write_weights(src, tmp_path, 7)
    assert path.name == "policy_v000007.safetensors" and not list(tmp_path.glob(".*tmp"))
    load_weights(dst, path)
    assert dst.model.embed_tokens.weight is embed  # in place: views over the model see it
    assert dst.lm_head.weight is dst.model.embed_tokens.weight  # still tied
    for k, v in src.state_dict().items():
        assert torch.equal(v, dst.state_dict()[k]), k


def test_a_file_of_another_model_is_refused_before_any_copy(tmp_path):
    other, _ = tiny_model(hidden_size=32, seed=1)
    dst, _ = tiny_model(seed=2)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(WeightSyncError, match="wrong shape"):
        load_weights(dst, write_weights(other, tmp_path, 1))
    assert all(torch.equal(v, dst.state_dict()[k]) for k, v in before.items())
    with pytest.raises(WeightSyncError, match="no weights file"):
        load_weights(dst, tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(WeightSyncError, match="not a readable safetensors"):
        load_weights(dst, tmp_path / "junk.safetensors")


def test_server_reports_versions_and_rejects_bad_loads(tmp_path, served):
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "logprobs": 0}
    r = httpx.post(f"{served.url}/v1/completions", json=body).json()
    assert r["policy_version"] == 0 and r["choices"][0]["policy_version"] == 0
    bad = httpx.post(f"{served.url}/v1/load_weights", json={"path": str(tmp_path / "nope"), "version": 1})
    assert bad.status_code == 400 and "no weights file" in bad.json()["error"]["message"]
    assert httpx.post(f"{served.url}/v1/load_weights", json={"version": 1}).status_code == 400
    new, _ = tiny_model(seed=5)
    ok = httpx.post(
        f"{served.url}/v1/load_weights", json={"path": str(write_weights(new, tmp_path, 4)), "version": 4}
    )
    assert ok.status_code == 200 and ok.json()["policy_version"] == 4
    r = httpx.post(f"{served.url}/v1/completions", json=body).json()
    assert r["policy_version"] == 4


def test_a_lora_policy_is_served_merged(tmp_path, served):
    """The client pushes W + (alpha/r) B A; the served plain model then gives the policy's logprobs."""
    pytest.importorskip("peft")
    from flowgrpo.modeling.logprobs import action_logprobs
    from flowgrpo.modeling.lora import LoraSpec, apply_lora

    policy = apply_lora(tiny_model(seed=0)[0], LoraSpec(r=4, target_modules="all-linear"))
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)  # a trained adapter (B starts at zero)
    client = OpenAIBackend(served.url, "tiny", weight_sync_dir=str(tmp_path / "sync"))
    client.sync_weights(policy, version=1)
    assert served.policy_version == 1
    ids = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    mask, lmask = torch.ones_like(ids), torch.ones_like(ids)
    lmask[:, 0] = 0
    with torch.no_grad():
        want = action_logprobs(policy, ids, mask, lmask)[0]
        got = action_logprobs(served.backend.model, ids, mask, lmask)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_a_server_without_the_endpoint_is_a_clear_error(tmp_path):
    client = OpenAIBackend("http://127.0.0.1:9/v1", "x", weight_sync_dir=str(tmp_path), max_retries=0)
    with pytest.raises(OpenAIBackendError, match="weight sync"):
        client.sync_weights(tiny_model(seed=0)[0], version=1)
