"""The ``vllm`` backend: an in-process vLLM engine (optional extra ``flowgrpo[vllm]``, GPU).

vLLM is imported lazily, only when a :class:`VLLMBackend` is built from a model path; the class
also accepts an already built engine object with vLLM's ``LLM`` interface (how the unit tests
drive it with a fake engine, and how a user passes a tuned ``LLM``).

- Prompts are token ids (``{"prompt_token_ids": ids}``): no re-tokenization.
- ``SamplingParams(logprobs=0, ...)`` returns the logprob of each sampled token; the engine is
  built with ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10) so these are under the
  distribution actually sampled (after temperature / top-k / top-p), as training's importance
  ratios need. On older vLLM the option does not exist and the logprobs are of the raw model
  distribution; :attr:`VLLMBackend.logprobs_mode` says which one you got.
- Every prompt gets its own seed (``params.seed + i``) so a batch is reproducible.
- :meth:`VLLMBackend.sync_weights` pushes the trainer's weights after each optimizer step through
  public APIs: ``LLM.apply_model(fn)`` (vLLM V1: runs ``fn(model)`` in every worker) calling the
  model's ``load_weights(iterable of (name, tensor))``; older engines expose the model at
  ``llm.llm_engine.model_executor.driver_worker.model_runner.model``. The prefix cache is reset
  afterwards (cached KV blocks were computed with the old weights).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from flowgrpo.modeling.lora import inference_state_dict
from flowgrpo.rollout.backends.base import BackendBase, GenerationResult, SamplingParams, prompt_limits
from flowgrpo.utils.plugins import MissingExtraError


class VLLMUnavailableError(MissingExtraError):
    """vLLM is not installed (or cannot run here); the message says how to get it."""


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise VLLMUnavailableError(
            "the vllm backend needs vLLM and a CUDA GPU: `pip install 'flowgrpo[vllm]'` on a GPU machine "
            "(it pins its own torch; keep it out of CPU installs), or use backend 'hf'"
        ) from e
    return vllm


class VLLMBackend(BackendBase):
    """A :class:`~flowgrpo.rollout.backends.base.RolloutBackend` over ``vllm.LLM``.

    Args:
        model_or_engine: a model path/name (an ``LLM`` is built with ``engine_kwargs``) or an object
            with vLLM's ``LLM`` interface (``generate(prompts, sampling_params, use_tqdm=...)``).
        max_batch_size: what the rollout scheduler sends per call (vLLM batches continuously inside).
        sampling_params_cls: vLLM's ``SamplingParams`` class (default: imported from vllm).
        engine_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization=0.5, dtype="bfloat16"``).
    """

    def __init__(
        self,
        model_or_engine: Any,
        *,
        max_batch_size: int = 256,
        sampling_params_cls: Any = None,
        **engine_kwargs: Any,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.logprobs_mode = "processed_logprobs"
        if isinstance(model_or_engine, str):
            vllm = import_vllm()
            kw = {"enable_prefix_caching": True, **engine_kwargs}
            try:
                self.llm = vllm.LLM(model=model_or_engine, logprobs_mode="processed_logprobs", **kw)
            except TypeError:  # vLLM < 0.10 has no logprobs_mode: raw-model logprobs
                self.llm = vllm.LLM(model=model_or_engine, **kw)
                self.logprobs_mode = "raw_logprobs"
            self._sp = sampling_params_cls or vllm.SamplingParams
        else:
            self.llm = model_or_engine
            self.logprobs_mode = getattr(model_or_engine, "logprobs_mode", self.logprobs_mode)
            self._sp = sampling_params_cls or import_vllm().SamplingParams
        self._lock = threading.Lock()
        self.weight_version = 0

    # ------------------------------------------------------------------ generation
    def _sampling(self, params: SamplingParams, limit: int, index: int) -> Any:
        kw: dict[str, Any] = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "max_tokens": limit,
            "logprobs": 0,
            "stop_token_ids": list(params.stop_token_ids),
            "skip_special_tokens": False,
            "detokenize": False,
        }
        if params.seed is not None:
            kw["seed"] = params.seed + index
        return self._sp(**kw)

    def generate_sync(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        limits = prompt_limits(params, len(prompts), max_new_tokens)
        sps = [self._sampling(params, m, i) for i, m in enumerate(limits)]
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        with self._lock:
            outputs = self.llm.generate(inputs, sampling_params=sps, use_tqdm=False)
        return [_result(o) for o in outputs]

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        """Decode in a worker thread so the event loop (tools of other episodes) keeps running."""
        return await asyncio.to_thread(self.generate_sync, prompts, params, max_new_tokens=max_new_tokens)

    # ------------------------------------------------------------------ weights
    def sync_weights(self, model: Any, *, version: int | None = None) -> None:
        """Load ``model``'s current weights (a torch module or an iterable of (name, tensor)) into
        the engine; call after each optimizer step. A LoRA policy sends its merged weights."""
        named = _named_tensors(model)
        with self._lock:
            if hasattr(self.llm, "apply_model"):
                self.llm.apply_model(lambda m: m.load_weights(named))
            else:
                runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
                runner.model.load_weights(named)
            if hasattr(self.llm, "reset_prefix_cache"):
                self.llm.reset_prefix_cache()
        self.weight_version = self.weight_version + 1 if version is None else version


def _named_tensors(model: Any) -> list[tuple[str, Any]]:
    if hasattr(model, "state_dict"):
        # detached tensors on the model's device (a LoRA policy merged: the engine has no adapters);
        # vLLM casts to its own dtype while loading
        return list(inference_state_dict(model).items())
    if isinstance(model, dict):
        return list(model.items())
    if isinstance(model, Iterable):
        return list(model)
    raise TypeError("sync_weights needs a torch module, a state dict, or an iterable of (name, tensor)")


def _result(request_output: Any) -> GenerationResult:
    """A vLLM ``RequestOutput`` (first completion) as a :class:`GenerationResult`."""
    out = request_output.outputs[0]
    ids = [int(t) for t in out.token_ids]
    lps = []
    for t, entry in zip(ids, out.logprobs or [], strict=False):
        lp = entry[t]  # {token_id: Logprob}; with logprobs=0 only the sampled token
        lps.append(float(getattr(lp, "logprob", lp)))
    if len(lps) != len(ids):
        raise RuntimeError(
            f"vLLM returned {len(ids)} tokens but {len(lps)} logprobs: build SamplingParams with logprobs=0"
        )
    reason = "length" if out.finish_reason == "length" else "stop"
    return GenerationResult(token_ids=ids, logprobs=lps, finish_reason=reason)


__all__ = ["VLLMBackend", "VLLMUnavailableError", "import_vllm"]
