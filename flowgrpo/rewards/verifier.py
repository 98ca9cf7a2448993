"""The ``verifier`` reward: a verifier model's probability that the answer is correct.

The seed's "GRPO trainer fed by a verifier": the model answers, a verifier is asked "Is the answer
correct?", and the reward is its probability of "Yes". We read it from the verifier's next-token
distribution right after the question (no sampling, no parsing of generated text)::

    reward = P(Yes) / (P(Yes) + P(No))

where ``P(Yes)`` sums the probabilities of every token that starts a "Yes" answer in the verifier's
own chat template (``Yes``, ``yes``: their first tokens after the assistant header), and likewise
``P(No)``. Normalising by ``P(Yes) + P(No)`` removes the mass the verifier puts elsewhere
(as in generative verifiers / "LLM-as-a-judge" probability scoring, e.g. Zhang et al. 2024,
"Generative Verifiers").

Two ways to reach the verifier:

- a local Hugging Face model (``hf_model=`` a name/path for :func:`flowgrpo.modeling.models.load_model`, or
  ``model=`` + ``tokenizer=``): prompts are batched (right padded) and only the last position's
  logits are computed; the embedded SmolLM2 can verify its own answers.
- any OpenAI-compatible server (``base_url=``): one ``/chat/completions`` request per episode with
  ``max_tokens: 1, logprobs: true, top_logprobs: k``; Yes/No tokens are matched by their text.
  ``flowgrpo serve`` provides ``top_logprobs``.

A failed call, or a reply whose top tokens hold neither Yes nor No, gives
:class:`~flowgrpo.rewards.base.Missing`: the episode is excluded from training and counted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

from flowgrpo.rewards.base import Missing, Reward, Score, final_answer, final_text
from flowgrpo.rollout.backends.openai import OpenAIBackend
from flowgrpo.types import Task, Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)

VERIFIER_TEMPLATE = """Here is a problem and a proposed final answer.

Problem: {prompt}

Proposed answer: {answer}

Is the proposed answer correct? Reply with Yes or No."""

YES_WORDS = ("Yes", "yes")
NO_WORDS = ("No", "no")


def yes_no_probability(p_yes: float, p_no: float) -> Score:
    """``p_yes / (p_yes + p_no)``, or :class:`Missing` when the verifier put no mass on either."""
    total = p_yes + p_no
    if not math.isfinite(total) or total <= 0.0:
        return Missing("verifier: no probability on Yes or No")
    return p_yes / total


def answer_token_ids(tokenizer: Any, messages: list[dict[str, str]], words: Sequence[str]) -> list[int]:
    """The first token of each of ``words`` as the verifier's chat template writes it after the
    assistant header: render the conversation with the word as the assistant's reply and take the
    token right after the generation prompt. Distinct ids, in order."""
    prompt = render_ids(tokenizer, messages)
    ids: list[int] = []
    for w in words:
        full = tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": w}], tokenize=False, add_generation_prompt=False
        )
        full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        if full_ids[: len(prompt)] != prompt or len(full_ids) <= len(prompt):
            # A template that rewrites earlier turns: fall back to the word tokenized on its own.
            tok = tokenizer(w, add_special_tokens=False)["input_ids"][:1]
        else:
            tok = [full_ids[len(prompt)]]
        ids += [t for t in tok if t not in ids]
    return ids


def render_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class HFVerifier:
    """A local causal LM as verifier: ``probabilities(prompts)`` gives ``(P(Yes), P(No))`` per chat,
    batched, from the last position's logits only."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        yes_words: Sequence[str] = YES_WORDS,
        no_words: Sequence[str] = NO_WORDS,
        batch_size: int = 8,
    ) -> None:
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        probe = [{"role": "user", "content": "Is 1 + 1 = 2?"}]
        self.yes_ids = answer_token_ids(tokenizer, probe, yes_words)
        self.no_ids = answer_token_ids(tokenizer, probe, no_words)
        if set(self.yes_ids) & set(self.no_ids):
            raise ValueError(
                f"the verifier's Yes tokens {self.yes_ids} and No tokens {self.no_ids} overlap: "
                "choose yes_words/no_words whose first tokens differ"
            )
        self._lock = threading.Lock()  # one forward at a time on a shared model

    def _batch(self, prompts: list[list[int]]) -> list[tuple[float, float]]:
        import torch

        from flowgrpo.modeling.logprobs import split_model

        backbone, head = split_model(self.model)
        dev = next(self.model.parameters()).device
        T = max(len(p) for p in prompts)
        # right padded (pads never precede a token), built on the verifier's device in one copy
        ids = torch.tensor(
            [list(p) + [0] * (T - len(p)) for p in prompts], dtype=torch.long, device=dev
        )  # (B, T)
        attn = torch.tensor(
            [[1] * len(p) + [0] * (T - len(p)) for p in prompts], dtype=torch.long, device=dev
        )
        last = torch.tensor([len(p) - 1 for p in prompts], device=dev)  # (B,)
        with self._lock, torch.no_grad():
            hidden = backbone(
                input_ids=ids, attention_mask=attn, use_cache=False
            ).last_hidden_state  # (B, T, H)
            logits = head(hidden[torch.arange(len(prompts), device=dev), last]).float()  # (B, V)
            probs = torch.softmax(logits, dim=-1)
        p_yes = probs[:, self.yes_ids].sum(-1).tolist()
        p_no = probs[:, self.no_ids].sum(-1).tolist()
        return list(zip(p_yes, p_no, strict=True))

    def probabilities(self, chats: Sequence[list[dict[str, str]]]) -> list[tuple[float, float]]:
        prompts = [render_ids(self.tokenizer, m) for m in chats]
        out: list[tuple[float, float]] = []
        for s in range(0, len(prompts), self.batch_size):
            out += self._batch(prompts[s : s + self.batch_size])
        return out


class OpenAIVerifier:
    """A verifier behind an OpenAI-compatible server: the first token's ``top_logprobs``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        top_logprobs: int = 20,
        yes_words: Sequence[str] = YES_WORDS,
        no_words: Sequence[str] = NO_WORDS,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        max_concurrency: int = 8,
    ) -> None:
        self.backend = OpenAIBackend(
            base_url,
            model,
            api_key=api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            max_concurrency=max_concurrency,
        )
        self.top_logprobs = top_logprobs
        self.yes_words, self.no_words = set(yes_words), set(no_words)

    async def probability(self, messages: list[dict[str, str]]) -> Score:
        try:
            data = await self.backend.chat_response(
                messages, temperature=0.0, max_tokens=1, logprobs=True, top_logprobs=self.top_logprobs
            )
            top = data["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            p_yes = p_no = 0.0
            for entry in top:
                word = str(entry["token"]).strip()
                if word in self.yes_words:
                    p_yes += math.exp(float(entry["logprob"]))
                elif word in self.no_words:
                    p_no += math.exp(float(entry["logprob"]))
        except Exception as e:  # transport errors, HTTP errors, a reply without top_logprobs
            return Missing(f"verifier: {type(e).__name__}: {e}"[:300])
        return yes_no_probability(p_yes, p_no)


class VerifierReward(Reward):
    """``P(Yes) / (P(Yes) + P(No))`` of a verifier asked whether the episode's final answer is right.

    Args:
        hf_model: a local model for :func:`flowgrpo.modeling.models.load_model` (e.g. ``smollm2-135m``).
        model, tokenizer: a model already in memory (e.g. the policy itself).
        base_url, server_model: an OpenAI-compatible server and its model name.
        template: the question; ``{prompt}`` (the task), ``{answer}`` (the final answer) and
            ``{reference}`` (the gold answer, for a reference-guided verifier) are filled in.
        no_answer_reward: the reward of an episode without a final answer (the verifier is not asked).
        batch_size: prompts per forward pass (local model).
        top_logprobs: how many top tokens the server returns (server).
        device: where ``hf_model`` runs (:func:`flowgrpo.modeling.hardware.resolve_device`; the build step
            passes the policy's; default ``auto``). A ``model=`` in memory stays where it is.
    """

    def __init__(
        self,
        *,
        hf_model: str | None = None,
        model: Any = None,
        tokenizer: Any = None,
        base_url: str | None = None,
        server_model: str = "default",
        api_key_env: str | None = "OPENAI_API_KEY",
        template: str = VERIFIER_TEMPLATE,
        yes_words: Sequence[str] = YES_WORDS,
        no_words: Sequence[str] = NO_WORDS,
        no_answer_reward: float = 0.0,
        batch_size: int = 8,
        top_logprobs: int = 20,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        max_concurrency: int = 8,
        device: str | None = None,
    ) -> None:
        if sum(x is not None for x in (hf_model, model, base_url)) != 1:
            raise ValueError(
                "the verifier reward needs exactly one verifier: hf_model= (a local model name or path), "
                "model= and tokenizer= (a model in memory) or base_url= (an OpenAI-compatible server)"
            )
        for key in ("{prompt}", "{answer}"):
            if key not in template:
                raise ValueError(f"the verifier template must contain {key} (and may use {{reference}})")
        self.template, self.no_answer_reward = template, no_answer_reward
        self.hf: HFVerifier | None = None
        self.server: OpenAIVerifier | None = None
        if base_url is not None:
            key = os.environ.get(api_key_env) if api_key_env else None
            self.server = OpenAIVerifier(
                base_url,
                server_model,
                api_key=key,
                top_logprobs=top_logprobs,
                yes_words=yes_words,
                no_words=no_words,
                timeout_s=timeout_s,
                max_retries=max_retries,
                max_concurrency=max_concurrency,
            )
        else:
            if hf_model is not None:
                from flowgrpo.modeling.hardware import resolve_device
                from flowgrpo.modeling.models import load_model

                model, tokenizer = load_model(hf_model, device=resolve_device(device))
            if tokenizer is None:
                raise ValueError("pass the verifier's tokenizer together with model=")
            self.hf = HFVerifier(
                model, tokenizer, yes_words=yes_words, no_words=no_words, batch_size=batch_size
            )

    def question(self, traj: Trajectory, task: Task) -> list[dict[str, str]] | None:
        """The verifier's chat for ``traj``, or None when the episode gave no final answer."""
        answer = final_answer(traj)
        if answer is None:
            text = final_text(traj).strip()
            if not text or traj.final_message is None or traj.final_message.tool_calls:
                return None
            answer = text
        content = self.template.format(
            prompt=task.prompt, answer=answer, reference=task.answer if task.answer is not None else "(none)"
        )
        return [{"role": "user", "content": content}]

    async def ascore(self, traj: Trajectory, task: Task) -> Score:
        return (await self.ascore_groups([TrajectoryGroup(task=task, trajectories=[traj])]))[0][0]

    async def ascore_group(self, group: TrajectoryGroup) -> list[Score]:
        return (await self.ascore_groups([group]))[0]

    async def ascore_groups(self, groups: Sequence[TrajectoryGroup]) -> list[list[Score]]:
        """Every episode of every group; a local verifier scores them all in batches."""
        chats = [self.question(t, g.task) for g in groups for t in g.trajectories]
        asked = [c for c in chats if c is not None]
        if self.hf is not None:
            try:
                pairs = await asyncio.to_thread(self.hf.probabilities, asked) if asked else []
                scores: list[Score] = [yes_no_probability(y, n) for y, n in pairs]
            except Exception as e:
                scores = [Missing(f"verifier: {type(e).__name__}: {e}"[:300])] * len(asked)
        else:
            assert self.server is not None
            scores = list(await asyncio.gather(*(self.server.probability(c) for c in asked)))
        it = iter(scores)
        flat = [self.no_answer_reward if c is None else next(it) for c in chats]
        out, i = [], 0
        for g in groups:
            out.append(flat[i : i + len(g.trajectories)])
            i += len(g.trajectories)
        return out


__all__ = [
    "NO_WORDS",
    "VERIFIER_TEMPLATE",
    "YES_WORDS",
    "HFVerifier",
    "OpenAIVerifier",
    "VerifierReward",
    "answer_token_ids",
    "yes_no_probability",
]
