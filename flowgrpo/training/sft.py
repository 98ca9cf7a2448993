"""Supervised warm start: demonstrations through the real tools, then cross-entropy on their actions.

Why: a small model that never emits a well-formed tool call earns no reward, so every group of
Flow-GRPO has equal rewards and nothing is learned. A few epochs of supervised learning on
demonstrations (the environment's oracle, run through the rollout engine's text-policy path so
the trajectories carry the exact token ids the model will see) give a policy whose samples
sometimes succeed; RL takes it from there (DeepSeek-R1's cold start; AgentFlow starts from an
instruction-tuned planner for the same reason).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from flowgrpo.algorithms.loss import sft_loss
from flowgrpo.components import Components
from flowgrpo.modeling.logprobs import action_logprobs
from flowgrpo.rollout.agentflow.oracle import FlowOracleAgent, module_demonstrations
from flowgrpo.rollout.engine import TextPolicy, run_text_policy
from flowgrpo.training.batching import Row, build_rows, micro_batches
from flowgrpo.training.loss_scale import loss_scale_for
from flowgrpo.training.optim import adamw
from flowgrpo.types import Trajectory
from flowgrpo.utils import interrupt

log = logging.getLogger(__name__)

DEMO_CHUNK = 16  # demonstrations run together between two progress updates


class WarmStartError(RuntimeError):
    """A warm start that has nothing to learn from; the message says why."""


def demonstrations(
    parts: Components, n_tasks: int, policy: TextPolicy | None = None, *, offset: int = 0
) -> list[Trajectory]:
    """Episodes of ``policy`` (default: each environment's oracle) on train tasks ``offset ..
    offset + n_tasks``: ordinary trajectories with exact token ids, scored by the run's reward.
    With ``agent.kind: flow`` and no ``policy``, the oracle scripts flow episodes (planner turns;
    the modules' replies are in each turn's metadata, see :func:`module_rows`)."""
    cfg = parts.config
    tasks = parts.tasks("train")[offset : offset + n_tasks]
    agent = (
        FlowOracleAgent(cfg.agent, parts.tokenizer) if cfg.agent.kind == "flow" and policy is None else None
    )
    groups = []
    with _bar(parts, len(tasks), "sft demonstrations", "episode") as bar:
        for i in range(0, len(tasks), DEMO_CHUNK):  # chunks: a progress bar that moves
            groups += run_text_policy(
                parts.env_factory,
                tasks[i : i + DEMO_CHUNK],
                policy,
                parts.tokenizer,
                cfg.rollout,
                agent=agent,
            )
            bar.update(len(tasks[i : i + DEMO_CHUNK]))
    parts.reward.score_groups(groups)
    return [t for g in groups for t in g.trajectories]


@contextmanager
def _bar(parts: Components, total: int, desc: str, unit: str) -> Iterator[Any]:
    """A tqdm bar when ``run.progress`` is on (a disabled one otherwise)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, leave=False, disable=not parts.config.run.progress)
    try:
        yield bar
    finally:
        bar.close()


def successful(demos: Sequence[Trajectory]) -> list[Trajectory]:
    """The demonstrations that earned reward; none at all is an error that says what happened."""
    if not demos:
        raise WarmStartError("sft: no demonstrations were run (sft.tasks is 0 or the env has no train tasks)")
    good = [t for t in demos if t.reward > 0]
    if good:
        return good
    ends = Counter(t.termination.value for t in demos)
    hint = ""
    if ends.get("max_tokens"):
        hint = f" {ends['max_tokens']} hit rollout.max_new_tokens: raise it."
    elif ends.get("context_overflow"):
        hint = f" {ends['context_overflow']} overflowed rollout.max_context_tokens: raise it."
    elif ends.get("max_turns"):
        hint = f" {ends['max_turns']} ran out of rollout.max_turns: raise it."
    elif ends.get("error"):
        first = next(t for t in demos if t.termination.value == "error")
        hint = f" {ends['error']} ended with an error, e.g. {first.metadata.get('error')}."
    raise WarmStartError(
        f"sft: none of the {len(demos)} demonstrations earned reward (ends: {dict(ends)}).{hint} "
        "Otherwise check the environment's oracle and the rewards."
    )


def supervised_epochs(
    parts: Components,
    trajectories: Sequence[Trajectory],
    *,
    epochs: int = 1,
    lr: float = 1e-4,
    batch_trajectories: int = 8,
) -> list[dict[str, float]]:
    """Cross-entropy on the action tokens of ``trajectories`` (packed rows, the trainer's
    micro-batching), with an AdamW of its own so the RL optimizer state is untouched.
    Returns one ``{"loss", "tokens"}`` per epoch."""
    cfg = parts.config
    model = parts.model
    rows = build_rows(trajectories, pack=cfg.train.pack_rows, require_advantages=False)
    if not rows:
        raise WarmStartError("sft: the trajectories have no action tokens")
    opt = adamw(model, lr=lr)
    scaler = loss_scale_for(parts.autocast)  # float16 autocast: dynamic loss scaling
    by_seq: dict[int, list[Row]] = {}
    for r in rows:
        by_seq.setdefault(r.seq_index, []).append(r)
    gen = torch.Generator().manual_seed(cfg.train.seed)
    hist = []
    model.train()
    for epoch in range(epochs):
        seqs = [list(by_seq)[i] for i in torch.randperm(len(by_seq), generator=gen).tolist()]
        tot, ntok = 0.0, 0.0
        with _bar(parts, len(seqs), f"sft epoch {epoch + 1}/{epochs}", "traj") as bar:
            for k in range(0, len(seqs), batch_trajectories):
                interrupt.check()  # a stop requested by a signal ends the epochs between batches
                batch = [r for s in seqs[k : k + batch_trajectories] for r in by_seq[s]]
                opt.zero_grad(set_to_none=True)
                for mb in micro_batches(
                    batch, cfg.train.micro_batch_tokens, pad_id=parts.pad_id, device=parts.device
                ):
                    lp, _ = action_logprobs(
                        model,
                        mb.input_ids,
                        mb.attention_mask,
                        mb.loss_mask,
                        temperature=cfg.rollout.logprob_temperature,
                        autocast_dtype=parts.autocast,
                        chunk_size=cfg.train.logprob_chunk,
                    )
                    loss = sft_loss(lp, mb.loss_mask, mb.token_weights)
                    scaler.scale(loss).backward()
                    tot += loss.item() * float(sum(r.num_action_tokens for r in batch))
                scaler.unscale_(model.parameters())
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip or float("inf"))
                overflow = scaler.enabled and not math.isfinite(float(norm))
                scaler.update(found_inf=overflow)
                if not overflow:  # an fp16 overflow skips the step; the halved scale retries the next batch
                    opt.step()
                ntok += sum(r.num_action_tokens for r in batch)
                bar.update(len(seqs[k : k + batch_trajectories]))
                bar.set_postfix(loss=f"{tot / max(ntok, 1.0):.4f}")
        hist.append({"loss": tot / max(ntok, 1.0), "tokens": ntok})
        log.info("sft epoch: loss %.4f over %d tokens", hist[-1]["loss"], ntok)
    return hist


def module_rows(parts: Components, demos: Sequence[Trajectory]) -> list[Trajectory]:
    """With ``agent.kind: flow``: the replies of the frozen modules that *are* the policy
    (``source: policy``) in flow ``demos``, as trajectories of their own, so the warm start teaches
    the shared weights every role they play; modules on another model are not the policy's to learn.
    Empty for the tool agent."""
    agent = parts.config.agent
    if agent.kind != "flow":
        return []
    served = {"executor": agent.executor, "verifier": agent.verifier, "generator": agent.generator}
    mine = [name for name, module in served.items() if module.source == "policy"]
    return module_demonstrations(demos, agent, parts.tokenizer, modules=mine)


def warm_start_demonstrations(parts: Components) -> list[Trajectory]:
    """The config's ``sft`` demonstrations: ``sft.tasks`` oracle episodes (and, for the flow agent,
    its policy-served modules' replies), the successful ones when ``sft.only_successful``."""
    s = parts.config.sft
    demos = demonstrations(parts, s.tasks)
    demos += module_rows(parts, demos)
    return successful(demos) if s.only_successful else demos


def warm_start(parts: Components) -> list[dict[str, float]]:
    """The config's ``sft`` section: :func:`warm_start_demonstrations` -> supervised epochs."""
    s = parts.config.sft
    demos = warm_start_demonstrations(parts)
    return supervised_epochs(parts, demos, epochs=s.epochs, lr=s.lr, batch_trajectories=s.batch_trajectories)


__all__ = [
    "WarmStartError",
    "demonstrations",
    "module_rows",
    "successful",
    "supervised_epochs",
    "warm_start",
    "warm_start_demonstrations",
]
