"""One build step: a :class:`~flowgrpo.config.TrainConfig` becomes the parts a run is made of.

    parts = build(load_config("examples/calculator_agent.yaml"))
    parts.backend, parts.env_factory, parts.tasks("test"), parts.reward, parts.estimator

The trainer, evaluation (``flowgrpo eval``), replay, the benchmarks and the examples all start from
:func:`build`, so a config means the same thing everywhere: the same policy, the same backend
(``rollout.backend: hf | openai | vllm``), the same environment and tasks, the same reward. Any part
can be passed in ready-made (a model already in memory, a custom environment class, a reward with
live objects) and the rest is built around it.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from flowgrpo.algorithms.advantages import Estimator, get_estimator
from flowgrpo.chat.parsing import ActionParser
from flowgrpo.config import EnvConfig, TrainConfig
from flowgrpo.env import Environment, Split
from flowgrpo.modeling.hardware import (
    resolve_autocast,
    resolve_device,
    resolve_rollout_dtype,
    sampler_matches_trainer,
)
from flowgrpo.modeling.lora import apply_lora, is_lora
from flowgrpo.rollout.backends.base import RolloutBackend
from flowgrpo.rollout.engine import EpisodeAgent
from flowgrpo.types import Task, TrajectoryGroup
from flowgrpo.utils.seeding import seed_everything


@runtime_checkable
class GroupScorer(Protocol):
    """Fills ``Trajectory.reward`` (and its breakdown) for every episode of every group."""

    def score_groups(self, groups: Sequence[TrajectoryGroup]) -> None: ...


@dataclass
class Components:
    """What a config builds. ``model`` is the policy the trainer updates; ``backend`` samples
    episodes from it (``hf`` shares the object, ``vllm`` receives its weights after each update,
    ``openai`` is a server with its own copy)."""

    config: TrainConfig
    model: Any
    tokenizer: Any
    backend: RolloutBackend
    env_factory: Callable[[], Environment]
    reward: GroupScorer
    estimator: Callable[[Sequence[TrajectoryGroup]], None]
    autocast: str | None
    """The training passes' autocast dtype (``model.autocast`` resolved for this machine)."""
    rollout_dtype: str | None
    """The dtype of the inference copy the ``hf`` backend samples from (``model.rollout_dtype``
    resolved); None: it samples the trained weights (under ``autocast``)."""
    tis: Literal["off", "token", "sequence_mask"]
    """``algorithm.tis`` resolved: ``auto`` is ``token`` unless sampler and trainer agree."""
    probe_env: Environment
    """One instance of the environment, for its tasks and its parser (never stepped)."""
    agent: EpisodeAgent | None = None
    """The episode loop when ``agent.kind`` is not the plain tool agent (``flow``: the flow agent)."""
    _tasks: dict[str, list[Task]] = field(default_factory=dict, repr=False)

    @property
    def device(self) -> Any:
        """The policy's ``torch.device``: where every tensor of a forward pass is created
        (micro-batches, masks, values), so no input ever crosses devices."""
        return next(self.model.parameters()).device

    @property
    def parser(self) -> ActionParser:
        return self.probe_env.parser

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else 0)

    def tasks(self, split: Split) -> list[Task]:
        """The environment's tasks of ``split`` (generated once)."""
        if split not in self._tasks:
            self._tasks[split] = self.probe_env.tasks(split)
        return self._tasks[split]


def build(
    config: TrainConfig,
    *,
    model: Any = None,
    tokenizer: Any = None,
    env_factory: Callable[[], Environment] | None = None,
    reward: GroupScorer | None = None,
    backend: RolloutBackend | None = None,
) -> Components:
    """Build every part ``config`` names; the keyword arguments replace the part of that name.

    Seeds python/numpy/torch from ``train.seed`` first, so a model initialised here (``tiny``) is
    the same on every run.

    The policy goes on ``model.device`` (:func:`flowgrpo.modeling.hardware.resolve_device`). A model passed
    in stays where it is under ``auto`` and moves to an explicit device; the rewards that load
    models of their own (``verifier``, ``reward_model``, ``judge``) default to the policy's device.
    """
    cfg = config
    if env_factory is None:  # a wrong name fails here, in one line, before a model loads
        check_env_name(cfg.env.name)
    seed_everything(cfg.train.seed)
    if model is None:
        if tokenizer is not None:
            raise ValueError("pass the model together with its tokenizer")
        model, tokenizer = load_policy(cfg)
    elif tokenizer is None:
        raise ValueError("pass the tokenizer together with the model")
    elif cfg.model.device != "auto":
        model = model.to(resolve_device(cfg.model.device))
    device = next(model.parameters()).device
    if cfg.model.lora is not None and not is_lora(model):
        model = apply_lora(model, cfg.model.lora)  # base frozen, adapters trainable
    if env_factory is None:
        env_factory = env_factory_of(cfg.env)
    if reward is None:
        reward = _composite_reward(cfg, str(device))
    autocast = resolve_autocast(cfg.model.autocast, device.type)
    rollout_dtype = resolve_rollout_dtype(cfg.model.rollout_dtype, device.type, cfg.model.dtype)
    if backend is None:
        backend = make_backend(cfg, model, tokenizer, autocast, rollout_dtype)
    agent = None
    if cfg.agent.kind == "flow":
        from flowgrpo.rollout.agentflow import build_flow_agent

        agent = build_flow_agent(
            cfg.agent, policy=model, tokenizer=tokenizer, backend=backend, autocast=autocast
        )
    return Components(
        config=cfg,
        model=model,
        tokenizer=tokenizer,
        backend=backend,
        env_factory=env_factory,
        reward=reward,
        estimator=estimator_of(cfg),
        autocast=autocast,
        rollout_dtype=rollout_dtype,
        tis=resolve_tis(cfg, rollout_dtype, autocast),
        probe_env=env_factory(),
        agent=agent,
    )


def env_factory_of(env: EnvConfig) -> Callable[[], Environment]:
    """Fresh environments as the ``env`` section names them (one per episode). Replay and the
    failure analysis use this part alone: it needs no model."""
    return functools.partial(_make_env, env.name, dict(env.kwargs))


def check_env_name(name: str) -> None:
    """A :class:`~flowgrpo.config.ConfigError` listing the registered environments when ``name``
    is not one of them."""
    from flowgrpo.config import ConfigError
    from flowgrpo.env import list_envs
    from flowgrpo.utils.plugins import is_spec

    known = list_envs()
    if name not in known and not is_spec(name):  # module:attr / file.py:attr load in env.make
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"env.name: unknown environment {name!r}; {hint}registered: {', '.join(known) or '(none)'} "
            '(a package adds one under the entry-point group "flowgrpo.envs"; or name one as '
            "module:Class or path/to/file.py:Class)"
        )


def _signature_mismatch(e: TypeError) -> bool:
    """Whether ``e`` says a call's keyword arguments do not fit the function (a config naming
    arguments a plugin does not take), not a failure inside it."""
    text = str(e)
    return (
        "unexpected keyword argument" in text
        or "required keyword-only argument" in text
        or ("missing" in text and "required positional argument" in text)
    )


def _composite_reward(cfg: TrainConfig, device: str) -> Any:
    """The ``rewards`` section's composite; a name no reward has, or kwargs a reward does not take,
    is a :class:`~flowgrpo.config.ConfigError` (one line on the command line), not a traceback."""
    from flowgrpo.config import ConfigError
    from flowgrpo.rewards import CompositeReward, UnknownRewardError

    try:
        return CompositeReward(cfg.rewards, device=device)
    except UnknownRewardError as e:
        raise ConfigError(f"rewards: {e}") from e
    except TypeError as e:
        if not _signature_mismatch(e):
            raise
        raise ConfigError(
            f"rewards: {e}: fix that reward's rewards.N.kwargs (its constructor's arguments)"
        ) from e


def _make_env(name: str, kwargs: dict[str, Any]) -> Environment:
    from flowgrpo.config import ConfigError
    from flowgrpo.env import make

    try:
        return make(name, **kwargs)
    except TypeError as e:
        if not _signature_mismatch(e):
            raise
        raise ConfigError(
            f"env.kwargs: environment {name!r} does not take {sorted(kwargs)}: {e}; fix env.kwargs"
        ) from e


def load_policy(cfg: TrainConfig) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``model.name``: ``tiny`` (a small random model seeded by
    ``train.seed``), an embedded model, a local HF directory or a GGUF file, on ``model.device``."""
    from flowgrpo.modeling import models

    device = resolve_device(cfg.model.device)  # before any load: a missing GPU fails in one line
    if cfg.model.name == "tiny":
        return models.tiny_model(seed=cfg.train.seed, device=device)
    return models.load_model(cfg.model.name, dtype=cfg.model.dtype, device=device)


def estimator_of(cfg: TrainConfig) -> Callable[[Sequence[TrajectoryGroup]], None]:
    """``algorithm.estimator`` with its ``estimator_kwargs`` (and ``turn_discount`` when set)
    bound: fills ``Turn.advantage``."""
    fn: Estimator = get_estimator(cfg.algorithm.estimator)
    kw = dict(cfg.algorithm.estimator_kwargs)
    if cfg.algorithm.turn_discount is not None:
        kw["turn_discount"] = cfg.algorithm.turn_discount
    return functools.partial(fn, **kw)


def resolve_tis(
    cfg: TrainConfig, rollout_dtype: str | None, autocast: str | None
) -> Literal["off", "token", "sequence_mask"]:
    """``algorithm.tis`` for this run: ``auto`` is ``token`` (truncated importance sampling, Yao et
    al. 2025, "Your efficient RL framework secretly brings you off-policy RL training") whenever the
    sampler's logprobs can differ from the trainer's: a bf16/fp16 sampler or trainer (ratios of
    0.85-1.20 on an on-policy update were measured under bf16, issue 27), another engine than the
    ``hf`` backend over the trained model, or samples of older policies (``async_staleness``)."""
    tis = cfg.algorithm.tis
    if tis != "auto":
        return tis
    exact = (
        cfg.rollout.backend == "hf"
        and sampler_matches_trainer(rollout_dtype, autocast)
        and not cfg.train.async_staleness
    )
    return "off" if exact else "token"


def make_backend(
    cfg: TrainConfig, model: Any, tokenizer: Any, autocast: str | None, rollout_dtype: str | None
) -> RolloutBackend:
    """The rollout backend ``rollout.backend`` names, around the policy ``model``; the ``hf`` backend
    samples from an inference copy in ``rollout_dtype``, or from ``model`` under ``autocast``."""
    r = cfg.rollout
    if r.backend == "hf":
        from flowgrpo.rollout.backends.hf import HFBackend

        if rollout_dtype is not None:
            return HFBackend(model, tokenizer, inference_dtype=rollout_dtype)
        return HFBackend(model, tokenizer, autocast_dtype=autocast)
    if r.backend == "openai":
        from flowgrpo.rollout.backends.openai import OpenAIBackend

        s = r.server
        assert s.base_url is not None  # RolloutConfig refuses openai without it
        api_key = None
        if s.api_key_env:
            api_key = os.environ.get(s.api_key_env)
            if not api_key:
                raise ValueError(f"rollout.server.api_key_env names {s.api_key_env!r}, which is not set")
        return OpenAIBackend(
            s.base_url,
            s.model or cfg.model.name,
            api_key=api_key,
            timeout_s=s.timeout_s,
            max_retries=s.max_retries,
            max_concurrency=s.max_concurrency,
            weight_sync_dir=s.weight_sync_dir,
        )
    from flowgrpo.modeling.models import local_model_dir
    from flowgrpo.rollout.backends.vllm import VLLMBackend, import_vllm

    import_vllm()  # a machine without vLLM says so before any model conversion
    v = r.vllm
    engine: dict[str, Any] = {"gpu_memory_utilization": v.gpu_memory_utilization, "dtype": v.dtype}
    if v.enforce_eager:
        engine["enforce_eager"] = True
    if v.max_model_len is not None:
        engine["max_model_len"] = v.max_model_len
    vllm_backend = VLLMBackend(str(local_model_dir(cfg.model.name)), **engine)
    vllm_backend.sync_weights(model)  # the engine samples from the policy as it is now
    return vllm_backend


__all__ = [
    "Components",
    "GroupScorer",
    "build",
    "env_factory_of",
    "estimator_of",
    "load_policy",
    "make_backend",
    "resolve_tis",
]
