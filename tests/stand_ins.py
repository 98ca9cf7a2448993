"""Stand-ins the tests share: a calculator tool and a parser for the chat-format tests (nothing
runs behind them), and a tiny random sequence classifier saved to disk as a reward model."""

from __future__ import annotations

import torch
from pydantic import BaseModel
from transformers import LlamaConfig, LlamaForSequenceClassification

from flowgrpo.modeling.models import tiny_tokenizer


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
