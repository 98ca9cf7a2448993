"""The ``judge`` reward: an LLM scores the transcript from 0 to 1.

The judge is any OpenAI-compatible endpoint (through :meth:`flowgrpo.rollout.backends.openai.OpenAIBackend.chat`,
the one HTTP client of the project: timeout, retries, a concurrency limit) or a local HF model. A
failed call or a reply without a score never crashes a run: the episode gets no reward
(:class:`~flowgrpo.rewards.base.Missing`, so it is excluded from training and counted), or a fixed
``fallback`` value when one is configured.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from flowgrpo.rewards.base import Missing, Reward, Score
from flowgrpo.rollout.backends.openai import OpenAIBackend, OpenAIBackendError
from flowgrpo.types import Task, Trajectory, TrajectoryGroup
from flowgrpo.utils.aio import run_sync

log = logging.getLogger(__name__)


JUDGE_TEMPLATE = """You are a strict grader. Judge the quality of an AI assistant's work on a task.

Task:
{prompt}

Reference answer: {reference}

Assistant's transcript (its actions and the tool results it saw):
{transcript}

Grade the work from 0 to 1: 1 = correct final answer with clear, concise, well-founded steps and sensible tool use; 0.5 = partly right or poorly justified; 0 = wrong, missing or incoherent.
Reply with one line: SCORE: <number between 0 and 1>"""


def render_transcript(traj: Trajectory, *, max_chars: int = 6000) -> str:
    """The trajectory's actions and observations as plain text (the head is cut when too long)."""
    lines: list[str] = []
    for i, turn in enumerate(traj.turns):
        lines.append(f"[assistant, turn {i + 1}]\n{turn.action.content.strip()}")
        for obs in turn.observations:
            who = f"tool {obs.name}" if obs.role == "tool" else obs.role
            lines.append(f"[{who}]\n{obs.content.strip()}")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else "...\n" + text[-max_chars:]


_SCORE_PATTERNS = [
    re.compile(r"\"?score\"?\s*[:=]\s*\"?(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?)|(%))?", re.I),
    re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)"),
    re.compile(r"(-?\d+(?:\.\d+)?)\s*(%)"),
]


def parse_score(text: str) -> float | None:
    """A 0-1 score from a judge's reply, or None if there is none.

    Accepts ``SCORE: 0.8``, ``{"score": 0.8}``, ``Score = 8/10``, ``80%``, a bare ``0.8``; a bare
    number in (1, 10] is read as a 10-point scale and (10, 100] as a percentage. The *last*
    ``score:`` wins (judges often restate the rubric first). Values are clamped to [0, 1].
    """
    if not text:
        return None
    text = text.strip()
    try:  # a JSON object reply
        obj = json.loads(text)
        if isinstance(obj, dict) and isinstance(obj.get("score"), (int, float)):
            return _scale(float(obj["score"]), None)
    except (json.JSONDecodeError, TypeError):
        pass
    m = list(_SCORE_PATTERNS[0].finditer(text))
    if m:
        g = m[-1]
        denom = 100.0 if g.group(3) else (float(g.group(2)) if g.group(2) else None)
        return _scale(float(g.group(1)), denom)
    for pat in _SCORE_PATTERNS[1:]:
        m = list(pat.finditer(text))
        if m:
            g = m[-1]
            denom = 100.0 if g.group(2) == "%" else float(g.group(2))
            return _scale(float(g.group(1)), denom)
    nums = re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])", text)
    if len(nums) == 1 or (nums and len(text) < 20):
        return _scale(float(nums[-1]), None)
    return None


def parse_rubric_score(text: str, low: float, high: float) -> float | None:
    """A score on a ``low``-``high`` rubric (e.g. 1-5), normalised to [0, 1] as
    ``(x - low) / (high - low)``; None when the reply has none or it lies outside the rubric.

    The number is the last ``score: x`` (``x/5`` reads as x), else the only number of the reply.
    Unlike :func:`parse_score` there is no guessing of the scale: ``SCORE: 4`` on 1-5 is 0.75.
    """
    if not text or not high > low:
        return None
    m = list(_SCORE_PATTERNS[0].finditer(text))
    frac = [g for g in _SCORE_PATTERNS[1].finditer(text) if float(g.group(2)) == high]
    if m:
        x = float(m[-1].group(1))
    elif frac:  # "4/5"
        x = float(frac[-1].group(1))
    else:
        nums = re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])", text)
        if len(nums) != 1:
            return None
        x = float(nums[0])
    if not low <= x <= high:
        return None
    return (x - low) / (high - low)


def _scale(x: float, denom: float | None) -> float | None:
    if denom is not None:
        if denom <= 0:
            return None
        x = x / denom
    elif x > 10:
        x = x / 100
    elif x > 1:
        x = x / 10
    if not math.isfinite(x):
        return None
    return min(1.0, max(0.0, x))


class ChatClient(Protocol):
    async def complete(self, messages: list[dict[str, str]]) -> str: ...


class JudgeCallError(RuntimeError):
    """A judge call that failed after all retries."""


class OpenAIChatClient:
    """A judge client for ``POST {base_url}/chat/completions`` of any OpenAI-compatible server.

    It is :meth:`OpenAIBackend.chat <flowgrpo.rollout.backends.openai.OpenAIBackend.chat>`, so the judge
    shares the backend's timeout, retries (transport errors, timeouts, 429 and 5xx, with exponential
    backoff; another 4xx is a configuration error and fails at once) and concurrency limit. A call
    that fails for good raises :class:`JudgeCallError`. ``base_url`` is read as the backend reads
    it: ``/v1`` is added when missing.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        temperature: float = 0.0,
        max_tokens: int = 64,
        max_concurrency: int = 32,
    ) -> None:
        self.backend = OpenAIBackend(
            base_url,
            model,
            api_key=api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            max_concurrency=max_concurrency,
        )
        self.temperature, self.max_tokens = temperature, max_tokens

    async def complete(self, messages: list[dict[str, str]]) -> str:
        try:
            return await self.backend.chat(messages, temperature=self.temperature, max_tokens=self.max_tokens)
        except OpenAIBackendError as e:
            raise JudgeCallError(str(e)) from e
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise JudgeCallError(f"malformed chat completion ({type(e).__name__}: {e})") from e


class HFChatClient:
    """A local transformers model as judge (greedy decoding, in a worker thread)."""

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = 32) -> None:
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        self._lock = threading.Lock()  # one generate at a time on a shared model

    def _generate(self, messages: list[dict[str, str]]) -> str:
        import torch

        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        tokens = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        dev = next(self.model.parameters()).device
        ids = torch.tensor([tokens], dtype=torch.long, device=dev)  # (1, T), on the judge's device
        with self._lock, torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    async def complete(self, messages: list[dict[str, str]]) -> str:
        return await asyncio.to_thread(self._generate, messages)


class JudgeReward(Reward):
    """LLM-judge quality score in [0, 1] (the seed's "LLM scorer" / DJ-Quality reward).

    ``client`` is any object with ``async complete(messages) -> str``; build one with ``base_url``
    + ``model`` (OpenAI-compatible server) or pass ``hf_model`` (a name/path for
    :func:`flowgrpo.modeling.models.load_model`). At most ``max_concurrency`` calls run at once. A call that
    fails (after the client's retries) or a reply without a parsable score is logged, counted in
    ``self.failures`` and gives :class:`~flowgrpo.rewards.base.Missing` (the episode leaves the
    update and its group's baseline), or ``fallback`` when it is a number; training never crashes
    on a judge. ``score_range=[1, 5]`` reads the reply on that rubric and normalises it to [0, 1]
    (:func:`parse_rubric_score`); without it, :func:`parse_score` reads a 0-1, /10 or % score.
    ``device``: where ``hf_model`` runs (:func:`flowgrpo.modeling.hardware.resolve_device`; the build step
    passes the policy's; default ``auto``).
    """

    def __init__(
        self,
        *,
        client: ChatClient | None = None,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        hf_model: str | None = None,
        template: str = JUDGE_TEMPLATE,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        max_concurrency: int = 8,
        fallback: float | None = None,
        max_transcript_chars: int = 6000,
        score_range: tuple[float, float] | None = None,
        device: str | None = None,
    ) -> None:
        if client is None:
            if base_url is not None:
                key = api_key or (os.environ.get(api_key_env) if api_key_env else None)
                client = OpenAIChatClient(
                    base_url,
                    model or "default",
                    api_key=key,
                    timeout_s=timeout_s,
                    max_retries=max_retries,
                    max_concurrency=max_concurrency,
                )
            elif hf_model is not None:
                from flowgrpo.modeling.hardware import resolve_device
                from flowgrpo.modeling.models import load_model

                m, tok = load_model(hf_model, device=resolve_device(device))
                client = HFChatClient(m, tok)
            else:
                raise ValueError(
                    "the judge reward needs a client: pass base_url= (and model=) for an "
                    "OpenAI-compatible server, hf_model= for a local model, or client="
                )
        for key_ in ("{prompt}", "{transcript}"):
            if key_ not in template:
                raise ValueError(f"the judge template must contain {key_} (and may use {{reference}})")
        self.client, self.template, self.fallback = client, template, fallback
        self.max_transcript_chars = max_transcript_chars
        if score_range is not None and not (len(score_range) == 2 and score_range[0] < score_range[1]):
            raise ValueError(
                f"score_range must be [low, high] with low < high (e.g. [1, 5]), got {score_range}"
            )
        self.score_range = None if score_range is None else (float(score_range[0]), float(score_range[1]))
        self.max_concurrency = max_concurrency
        self.failures = 0
        self.calls = 0

    def render(self, traj: Trajectory, task: Task) -> list[dict[str, str]]:
        text = self.template.format(
            prompt=task.prompt,
            reference=task.answer if task.answer is not None else "(none)",
            transcript=render_transcript(traj, max_chars=self.max_transcript_chars),
        )
        return [{"role": "user", "content": text}]

    def _failed(self, traj: Trajectory, why: str) -> Score:
        self.failures += 1
        if self.fallback is None:
            log.warning("judge: %s for %s; the episode gets no reward", why, traj.id)
            return Missing(f"judge: {why}")
        log.warning("judge: %s for %s; using fallback %s", why, traj.id, self.fallback)
        return self.fallback

    async def _one(self, traj: Trajectory, task: Task, sem: asyncio.Semaphore) -> Score:
        self.calls += 1
        async with sem:
            try:
                reply = await self.client.complete(self.render(traj, task))
            except Exception as e:
                return self._failed(traj, f"call failed ({type(e).__name__}: {e})")
        if self.score_range is None:
            score = parse_score(reply)
        else:
            score = parse_rubric_score(reply, *self.score_range)
        if score is None:
            return self._failed(traj, f"reply has no score ({reply[:120]!r})")
        return score

    async def ascore(self, traj: Trajectory, task: Task) -> Score:
        return await self._one(traj, task, asyncio.Semaphore(self.max_concurrency))

    async def ascore_group(self, group: TrajectoryGroup) -> list[Score]:
        return (await self.ascore_groups([group]))[0]

    async def ascore_groups(self, groups: Sequence[TrajectoryGroup]) -> list[list[Score]]:
        """All groups at once, sharing one concurrency limit."""
        sem = asyncio.Semaphore(self.max_concurrency)
        flat = await asyncio.gather(*(self._one(t, g.task, sem) for g in groups for t in g.trajectories))
        out, i = [], 0
        for g in groups:
            out.append(list(flat[i : i + len(g.trajectories)]))
            i += len(g.trajectories)
        return out

    def score(self, traj: Trajectory, task: Task) -> Score:
        return run_sync(self.ascore(traj, task))
