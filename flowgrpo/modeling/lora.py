"""LoRA through peft: low-rank adapters on a frozen base, the base as the KL reference, adapters-only
checkpoints, and a merged export.

Why: full fine-tuning keeps fp32 weights, gradients, two AdamW moments and a frozen reference copy
of every parameter (five copies of the model). With LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation
of Large Language Models") only the adapters ``B @ A`` (rank ``r``) train, so gradients and optimizer
state shrink to the adapters, and the reference model needs no copy at all: it is the same module
with its adapters switched off (``PeftModel.disable_adapter()``, the way TRL's GRPOTrainer computes
reference logprobs for a peft policy).

- :class:`LoraSpec` is the ``model.lora`` config section (``r``, ``alpha``, ``target_modules``,
  ``dropout``; peft's names).
- :func:`apply_lora` wraps a transformers causal LM in a ``PeftModel`` (base weights frozen).
- :func:`reference_mode` is the context in which the policy computes reference logprobs.
- :func:`adapter_state_dict` / :func:`load_adapter_state`: the adapters, which are all a checkpoint
  stores of a LoRA policy (:func:`flowgrpo.runs.checkpoint.policy_state_dict`).
- :func:`inference_state_dict`: the merged weights an inference engine loads (vLLM, a served policy).
- :func:`merged_model` folds the adapters into the base weights and returns a plain transformers model
  (``W + (alpha / r) * B @ A``), which ``save_pretrained`` writes as an ordinary HF model.

``peft`` (the ``lora`` extra) is imported only when a LoRA policy is built or inspected.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ALL_LINEAR = "all-linear"


class LoraSpec(BaseModel):
    """``model.lora``: adapters of rank ``r`` on the named linear layers; ``alpha / r`` scales them."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    r: int = Field(16, ge=1, description="adapter rank")
    alpha: float = Field(32.0, gt=0, description="scale numerator: the update is (alpha / r) * B @ A")
    target_modules: list[str] | str = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="module names (suffixes) to adapt, or 'all-linear' (every linear but the LM head)",
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter input")


def _peft() -> Any:
    try:
        import peft
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("model.lora needs peft: pip install 'flowgrpo[lora]' (or pip install peft)") from e
    return peft


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft-wrapped policy (peft not imported yet means it cannot be one)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def apply_lora(model: Any, spec: LoraSpec) -> Any:
    """``model`` wrapped in LoRA adapters per ``spec``: base weights frozen, adapters trainable.

    peft initialises ``A`` randomly (Kaiming) and ``B`` to zeros, so the wrapped model computes
    exactly what the base did until the first update; the draw of ``A`` uses torch's global RNG,
    which :func:`flowgrpo.components.build` seeds, so a resumed run rebuilds the same layers before
    loading its adapters.
    """
    peft = _peft()
    if is_lora(model):
        raise ValueError("the model already carries LoRA adapters; pass the base model")
    targets = spec.target_modules
    config = peft.LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return peft.get_peft_model(model, config)
    except ValueError as e:
        names = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"}
        )
        raise ValueError(
            f"model.lora.target_modules={targets!r} matches no layer of this model ({e}); its linear "
            f"layers are named {names} (or use '{ALL_LINEAR}')"
        ) from None


@contextlib.contextmanager
def reference_mode(model: Any) -> Iterator[Any]:
    """The KL reference of a LoRA policy: the same module with its adapters off (no second copy).

    For any other model this yields it unchanged (its reference is a separate frozen copy)."""
    if is_lora(model):
        with model.disable_adapter():
            yield model
    else:
        yield model


def adapter_state_dict(model: Any) -> dict[str, Any]:
    """The adapter tensors of a LoRA policy (peft's own key format, as ``save_pretrained`` writes)."""
    return _peft().get_peft_model_state_dict(model)


def load_adapter_state(model: Any, state: dict[str, Any]) -> None:
    """Load adapters (from :func:`adapter_state_dict`) into a LoRA policy; adapters into a full model,
    or a state that lacks this policy's adapters, is an error that says which."""
    if not is_lora(model):
        raise ValueError(
            "this checkpoint holds LoRA adapters only: set model.lora as in the run that saved it"
        )
    try:
        result = _peft().set_peft_model_state_dict(model, state)
    except RuntimeError as e:  # shape mismatches: another base model or rank
        first = str(e).strip().splitlines()[1:2] or [str(e)]
        raise ValueError(
            f"these adapters do not fit this policy ({first[0].strip()}): same model.name and model.lora?"
        ) from None
    bad = [k for k in result.unexpected_keys if "lora_" in k]
    missing = [k for k in result.missing_keys if "lora_" in k]
    if bad or missing or not state:
        raise ValueError(
            "this checkpoint does not hold the adapters of this LoRA policy "
            f"(missing {missing[:3]}, unexpected {bad[:3]}): was it saved with the same model.lora?"
        )


def merged_state_dict(model: Any) -> dict[str, Any]:
    """The state dict of the merged model (plain transformers names, ``W + (alpha / r) * B @ A``),
    computed beside the policy: its own weights are not touched (merging and unmerging in place
    would not give back the same floats)."""
    from peft.tuners.lora import LoraLayer

    inner = model.get_base_model()
    deltas: dict[str, Any] = {}
    for name, module in inner.named_modules():
        if isinstance(module, LoraLayer):
            active = [a for a in module.active_adapters if a in module.lora_A]
            if active:
                deltas[name] = sum(module.get_delta_weight(a) for a in active).detach()
    out: dict[str, Any] = {}
    for key, value in inner.state_dict().items():
        if "lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        owner, _, leaf = plain.rpartition(".")
        out[plain] = (
            value.detach() + deltas[owner] if leaf == "weight" and owner in deltas else value.detach()
        )
    return out


def inference_state_dict(model: Any) -> dict[str, Any]:
    """The weights a separate inference engine (vLLM, ``flowgrpo serve``) loads for this policy:
    merged for a LoRA policy (the engine holds a plain model), the state dict otherwise."""
    if is_lora(model):
        return merged_state_dict(model)
    return {k: v.detach() for k, v in model.state_dict().items()}


def merged_model(model: Any) -> Any:
    """A plain transformers model whose weights are ``W + (alpha / r) * B @ A`` (a copy: ``model``
    keeps its adapters); ``save_pretrained`` writes it as an ordinary HF model."""
    if not is_lora(model):
        raise ValueError("merged_model needs a LoRA policy (model.lora); a full model has nothing to merge")
    return copy.deepcopy(model).merge_and_unload()


__all__ = [
    "ALL_LINEAR",
    "LoraSpec",
    "adapter_state_dict",
    "apply_lora",
    "inference_state_dict",
    "is_lora",
    "load_adapter_state",
    "merged_model",
    "merged_state_dict",
    "reference_mode",
]
