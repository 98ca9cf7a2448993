"""The ``reward_model`` reward: a learned reward model (any ``AutoModelForSequenceClassification``).

The PPO figure of the seeds scores episodes with a trained reward model. Any Hugging Face sequence
classifier saved in a local directory works (nothing is downloaded): the text it reads is the task
and the episode's transcript rendered with its own chat template (a user turn with the task, an
assistant turn with the transcript), scored in batches of ``batch_size``, right padded.

- ``label``: which output to use. ``None`` with one output (a scalar head, as reward models trained
  with TRL's ``RewardTrainer``) takes the logit; with several outputs a label name (from
  ``config.id2label``) or index takes that class's softmax probability.
- ``normalize``: ``none`` (the raw value), ``sigmoid`` (a logit into (0, 1)), ``group`` (z-score
  within each group: only relative quality counts), ``running`` (z-score with a running mean/std
  over every score seen so far, Welford; scores keep their meaning across steps).
- Scores are cached by trajectory id, so re-scoring a step (replay, a second reward term) is free.
- ``device``: where the classifier runs (:func:`flowgrpo.modeling.hardware.resolve_device`); the build step
  passes the policy's, so its inputs are created on the same GPU.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence
from typing import Literal

from flowgrpo.rewards.base import Reward, Score
from flowgrpo.rewards.judge import render_transcript
from flowgrpo.types import Task, Trajectory, TrajectoryGroup

Normalize = Literal["none", "sigmoid", "group", "running"]


class RewardModelReward(Reward):
    """A local sequence classifier's score of each episode (see the module docstring)."""

    def __init__(
        self,
        path: str,
        *,
        label: str | int | None = None,
        normalize: Normalize = "none",
        batch_size: int = 8,
        max_length: int = 1024,
        max_transcript_chars: int = 6000,
        device: str | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if normalize not in ("none", "sigmoid", "group", "running"):
            raise ValueError(f"normalize must be none, sigmoid, group or running, got {normalize!r}")
        from flowgrpo.modeling.hardware import resolve_device

        # the build step passes the policy's device; default auto (a GPU when there is one)
        self.model = (
            AutoModelForSequenceClassification.from_pretrained(path).eval().to(resolve_device(device))
        )
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        n = int(self.model.config.num_labels)
        if label is None:
            if n != 1:
                raise ValueError(
                    f"{path} has {n} outputs: pass label= (a name in {dict(self.model.config.id2label)} or "
                    "an index) to read one class's probability"
                )
            self.index: int | None = None
        elif isinstance(label, int):
            if not 0 <= label < n:
                raise ValueError(f"label index {label} is out of range for {n} outputs")
            self.index = label
        else:
            names = {str(v): int(k) for k, v in self.model.config.id2label.items()}
            if label not in names:
                raise ValueError(f"unknown label {label!r}; {path} has {sorted(names)}")
            self.index = names[label]
        self.normalize, self.batch_size, self.max_length = normalize, batch_size, max_length
        self.max_transcript_chars = max_transcript_chars
        self.cache: dict[str, float] = {}
        self._count, self._mean, self._m2 = 0, 0.0, 0.0  # Welford, for "running"
        self._lock = threading.Lock()
        self._torch = torch

    def text(self, traj: Trajectory, task: Task) -> str:
        transcript = render_transcript(traj, max_chars=self.max_transcript_chars)
        chat = [{"role": "user", "content": task.prompt}, {"role": "assistant", "content": transcript}]
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(chat, tokenize=False)
        return f"{task.prompt}\n\n{transcript}"

    def _raw(self, texts: list[str]) -> list[float]:
        torch = self._torch
        out: list[float] = []
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        device = next(self.model.parameters()).device
        for s in range(0, len(texts), self.batch_size):
            enc = [
                self.tokenizer(t, add_special_tokens=False, truncation=True, max_length=self.max_length)[
                    "input_ids"
                ]
                for t in texts[s : s + self.batch_size]
            ]
            T = max(len(e) for e in enc)
            # right padded, built on the model's device in one copy
            ids = torch.tensor(
                [e + [pad] * (T - len(e)) for e in enc], dtype=torch.long, device=device
            )  # (B, T)
            attn = torch.tensor(
                [[1] * len(e) + [0] * (T - len(e)) for e in enc], dtype=torch.long, device=device
            )
            with self._lock, torch.no_grad():
                logits = self.model(input_ids=ids, attention_mask=attn).logits.float()  # (B, L)
            if self.index is None:
                out += logits[:, 0].tolist()
            else:
                out += torch.softmax(logits, dim=-1)[:, self.index].tolist()
        return out

    def _norm(self, values: list[float]) -> list[float]:
        if self.normalize == "sigmoid":
            return [1.0 / (1.0 + math.exp(-v)) for v in values]
        if self.normalize == "group":
            if len(values) < 2:
                return [0.0] * len(values)
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            return [(v - mean) / std if std > 0 else 0.0 for v in values]
        if self.normalize == "running":
            for v in values:
                self._count += 1
                d = v - self._mean
                self._mean += d / self._count
                self._m2 += d * (v - self._mean)
            std = math.sqrt(self._m2 / (self._count - 1)) if self._count > 1 else 0.0
            return [(v - self._mean) / std if std > 0 else 0.0 for v in values]
        return values

    async def ascore(self, traj: Trajectory, task: Task) -> Score:
        return (await self.ascore_groups([TrajectoryGroup(task=task, trajectories=[traj])]))[0][0]

    async def ascore_group(self, group: TrajectoryGroup) -> list[Score]:
        return (await self.ascore_groups([group]))[0]

    async def ascore_groups(self, groups: Sequence[TrajectoryGroup]) -> list[list[Score]]:
        todo = [(t, g.task) for g in groups for t in g.trajectories if t.id not in self.cache]
        if todo:
            raw = await asyncio.to_thread(self._raw, [self.text(t, task) for t, task in todo])
            for (t, _), v in zip(todo, raw, strict=True):
                self.cache[t.id] = v
        if self.normalize == "running":
            flat = self._norm([self.cache[t.id] for g in groups for t in g.trajectories])
            out, i = [], 0
            for g in groups:
                out.append(flat[i : i + len(g.trajectories)])
                i += len(g.trajectories)
            return out
        return [self._norm([self.cache[t.id] for t in g.trajectories]) for g in groups]


__all__ = ["RewardModelReward"]
