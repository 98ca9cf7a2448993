"""The vllm backend against a fake engine with vLLM's ``LLM`` interface (vLLM cannot be installed
here), plus a ``gpu`` test that runs the real engine where vLLM and a GPU exist.

The fake engine is a real model underneath (a tiny HF Llama decoded by our hf backend), so the
test checks the translation both ways: our SamplingParams -> vLLM's (one per prompt, logprobs=0,
per-prompt seeds and limits), vLLM's RequestOutput -> GenerationResult, and weight sync through
``LLM.apply_model`` + ``model.load_weights``.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from flowgrpo.modeling.models import tiny_model
from flowgrpo.rollout.backends.base import RolloutBackend, SamplingParams
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.rollout.backends.vllm import VLLMBackend, VLLMUnavailableError


@dataclass
class FakeVLLMSamplingParams:
    """The fields of ``vllm.SamplingParams`` the backend sets (same names and defaults)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = 16
    logprobs: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True


class _WeightLoadingModel:
    """What vLLM model classes offer: ``load_weights(iterable of (name, tensor))``."""

    def __init__(self, model):
        self.model = model

    def load_weights(self, weights):
        self.model.load_state_dict(dict(weights), strict=True)


class FakeLLM:
    """vLLM's ``LLM`` surface: ``generate``, ``apply_model``, ``reset_prefix_cache``."""

    def __init__(self, model, tok):
        self.hf = HFBackend(model, tok)
        self.model = model
        self.requests = []
        self.prefix_resets = 0

    def generate(self, prompts, sampling_params, use_tqdm=True):
        outs = []
        for p, sp in zip(prompts, sampling_params, strict=True):
            assert sp.logprobs == 0 and not sp.detokenize
            self.requests.append((p, sp))
            params = SamplingParams(
                temperature=sp.temperature,
                top_p=sp.top_p,
                top_k=max(sp.top_k, 0),
                max_new_tokens=sp.max_tokens,
                stop_token_ids=sp.stop_token_ids or [-5],
                seed=sp.seed,
            )
            r = self.hf.generate_sync([p["prompt_token_ids"]], params)[0]
            lps = [
                {t: SimpleNamespace(logprob=lp, rank=1)}
                for t, lp in zip(r.token_ids, r.logprobs, strict=True)
            ]
            comp = SimpleNamespace(
                token_ids=tuple(r.token_ids), logprobs=lps, finish_reason=r.finish_reason, text=""
            )
            outs.append(SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[comp]))
        return outs

    def apply_model(self, fn):
        return [fn(_WeightLoadingModel(self.model))]

    def reset_prefix_cache(self):
        self.prefix_resets += 1


@pytest.fixture
def engine():
    model, tok = tiny_model()
    return FakeLLM(copy.deepcopy(model), tok), model, tok


def _be(llm):
    return VLLMBackend(llm, sampling_params_cls=FakeVLLMSamplingParams, max_batch_size=8)


def test_generate_translates_params_and_outputs(engine):
    llm, model, tok = engine
    be = _be(llm)
    assert isinstance(be, RolloutBackend)
    prompts = [[1, 5, 6], [1, 7, 8, 9]]
    params = SamplingParams(temperature=0.7, top_k=5, max_new_tokens=6, seed=3, stop_token_ids=[2])
    res = asyncio.run(be.generate(prompts, params, max_new_tokens=[4, 9]))
    sps = [sp for _, sp in llm.requests]
    assert [sp.seed for sp in sps] == [3, 4] and [sp.max_tokens for sp in sps] == [4, 6]
    assert all(sp.top_k == 5 and sp.stop_token_ids == [2] and sp.temperature == 0.7 for sp in sps)
    assert [p["prompt_token_ids"] for p, _ in llm.requests] == prompts
    # the same ids/logprobs the underlying model gives for that seed
    ref = HFBackend(model, tok).generate_sync([prompts[0]], params.model_copy(update={"max_new_tokens": 4}))[
        0
    ]
    assert res[0].token_ids == ref.token_ids and res[0].logprobs == pytest.approx(ref.logprobs, abs=1e-6)
    assert len(res[1].token_ids) <= 6
    # top_k=0 (off) is vLLM's -1
    asyncio.run(be.generate(prompts[:1], SamplingParams(max_new_tokens=2)))
    assert llm.requests[-1][1].top_k == -1 and llm.requests[-1][1].seed is None


def test_sync_weights_loads_the_trainer_weights_and_resets_the_prefix_cache(engine):
    llm, model, tok = engine
    be = _be(llm)
    prompt = [[1, 5, 6, 7]]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=5, stop_token_ids=[-5])
    before = be.generate_sync(prompt, greedy)[0]
    with torch.no_grad():  # an "optimizer step" on the trainer's copy
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    be.sync_weights(model)
    after = be.generate_sync(prompt, greedy)[0]
    trainer = HFBackend(model, tok).generate_sync(prompt, greedy)[0]
    assert after == trainer and after != before
    assert llm.prefix_resets == 1 and be.weight_version == 1
    assert all(
        torch.equal(a, b)
        for a, b in zip(llm.model.state_dict().values(), model.state_dict().values(), strict=True)
    )


def test_missing_logprobs_is_a_clear_error(engine):
    llm, *_ = engine

    class NoLogprobs(FakeLLM):
        def generate(self, prompts, sampling_params, use_tqdm=True):
            outs = super().generate(prompts, sampling_params, use_tqdm)
            for o in outs:
                o.outputs[0].logprobs = None
            return outs

    be = _be(NoLogprobs(llm.model, llm.hf.tokenizer))
    with pytest.raises(RuntimeError, match="logprobs=0"):
        be.generate_sync([[1, 2]], SamplingParams(max_new_tokens=2, stop_token_ids=[-5]))


def test_without_vllm_a_model_path_gives_install_instructions():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    with pytest.raises(VLLMUnavailableError, match=r"flowgrpo\[vllm\]"):
        VLLMBackend("some/model")


@pytest.mark.gpu
def test_real_vllm_engine_processed_logprobs(tmp_path):
    if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
        pytest.skip("needs vLLM and a CUDA GPU")
    from flowgrpo.modeling.models import load_model

    model, tok = load_model("smollm2-135m")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    be = VLLMBackend(str(tmp_path), gpu_memory_utilization=0.3, dtype="float32", enforce_eager=True)
    prompt = tok("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)[
        "input_ids"
    ]
    [r] = be.generate_sync(
        [prompt], SamplingParams(temperature=0.7, max_new_tokens=8, seed=0, stop_token_ids=[tok.eos_token_id])
    )
    ids = torch.tensor([prompt + r.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(r.logprobs), ref, atol=2e-2)
    be.sync_weights(model)
