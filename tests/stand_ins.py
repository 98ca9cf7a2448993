"""Stand-ins the tests share: a scripted policy backend (fixed text per assistant turn), a
calculator tool and a parser for the chat-format tests (nothing runs behind them), and a tiny
random sequence classifier saved to disk as a reward model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from pydantic import BaseModel
from transformers import LlamaConfig, LlamaForSequenceClassification

from flowgrpo.modeling.models import tiny_tokenizer
from flowgrpo.rollout.backends.base import BackendBase, GenerationResult, SamplingParams


class ScriptedBackend(BackendBase):
    """A scripted *policy*: the k-th assistant turn of a conversation says ``script[k]``.

    It records every call (prompts, results) so tests can check the exact ids fed and returned.
    ``script`` entries ending in ``"|LEN"`` are returned without the end-of-turn token and with
    ``finish_reason="length"``.
    """

    def __init__(
        self, tokenizer, script: Sequence[str] | Callable[[int], str], max_batch_size: int = 64
    ) -> None:
        self.tok = tokenizer
        self.script = script
        self.max_batch_size = max_batch_size
        self.calls: list[tuple[list[list[int]], list[GenerationResult]]] = []

    async def generate(
        self, prompts, params: SamplingParams, *, max_new_tokens=None
    ) -> list[GenerationResult]:
        outs = []
        im_start_asst = self.tok("<|im_start|>assistant", add_special_tokens=False)["input_ids"]
        for i, p in enumerate(prompts):
            k = _count(list(p), im_start_asst) - 1
            text = self.script(k) if callable(self.script) else self.script[min(k, len(self.script) - 1)]
            length = text.endswith("|LEN")
            ids = self.tok(text.removesuffix("|LEN"), add_special_tokens=False)["input_ids"]
            if not length:
                ids = [*ids, self.tok.eos_token_id]
            limit = params.max_new_tokens if max_new_tokens is None else max_new_tokens[i]
            reason = "length" if length else "stop"
            if len(ids) > limit:
                ids, reason = ids[:limit], "length"
            outs.append(GenerationResult(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason=reason))
        self.calls.append(([list(p) for p in prompts], outs))
        return outs


def _count(seq: list[int], sub: list[int]) -> int:
    n = len(sub)
    return sum(1 for i in range(len(seq) - n + 1) if seq[i : i + n] == sub)


class CalculatorArgs(BaseModel):
    expression: str


class StubCalculator:
    """The calculator tool's name and schema; it always answers 0."""

    name = "calculator"
    description = "Evaluate an arithmetic expression."
    args_schema = CalculatorArgs
    timeout_s = 1.0

    async def run(self, args):
        return "0"


class StubParser:
    """Only its tool instructions are used (the chat layer renders them into the prompt)."""

    def parse(self, text):
        raise NotImplementedError

    def format_instructions(self, tools):
        return "TOOLS: " + ",".join(t.name for t in tools)


def save_reward_model(tmp_path, num_labels: int, name: str):
    """A 1-layer Llama sequence classifier with ``num_labels`` outputs and a visible spread of
    scores, saved with the tiny tokenizer under ``tmp_path / name``; returns (path, model, tokenizer)."""
    tok = tiny_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_labels=num_labels,
        pad_token_id=tok.pad_token_id or 0,
        id2label={i: f"class{i}" for i in range(num_labels)},
        label2id={f"class{i}": i for i in range(num_labels)},
    )
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(cfg)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)  # a visible spread of scores
    path = tmp_path / name
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, model, tok
