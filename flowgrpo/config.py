"""Training configuration: typed pydantic sections, a YAML file, and dotted command-line overrides.

    cfg = load_config("examples/calculator_agent.yaml", ["train.lr=1e-5", "algorithm.estimator=gigpo"])

Every section forbids unknown keys, so a typo is an error that names the closest valid key instead of
a setting silently ignored. The configuration chooses functions (an estimator name from
:data:`flowgrpo.algorithms.advantages.ESTIMATORS`, a loss aggregation); the functions never read it.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flowgrpo.algorithms.curriculum import CurriculumConfig
from flowgrpo.modeling.hardware import check_device_setting
from flowgrpo.modeling.lora import LoraSpec
from flowgrpo.rewards import RewardSpec
from flowgrpo.rollout.agentflow.config import AgentConfig
from flowgrpo.rollout.engine import RolloutConfig
from flowgrpo.types import Termination
from flowgrpo.utils.errors import ConfigError
from flowgrpo.utils.foreign_names import key_hint, value_hint


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    """The policy. ``name``: an embedded model (``smollm2-135m``), a local HF directory, a ``.gguf``
    file, or ``tiny`` (a small random model for smoke tests)."""

    name: str = "smollm2-135m"
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="weight dtype; keep float32 master weights (bf16 weights barely learn)"
    )
    autocast: Literal["auto", "bfloat16", "float16"] | None = Field(
        "auto",
        description="autocast dtype of the training passes (update, warm start, reference/old logprobs) "
        "and of sampling when rollout_dtype is float32; null = off (fp32); auto = off: a bf16 update is "
        "2.5x faster on a bf16-native CPU but its RL phase gained nothing there (docs/learning.md section 8); "
        "bfloat16 = opt in; float16 = with dynamic loss scaling (flowgrpo/training/loss_scale.py), for "
        "GPUs: a CPU without avx512_fp16 runs it ~20x slower than fp32; flowgrpo/modeling/hardware.py",
    )
    rollout_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="the weights the rollout (hf backend) samples from: float32 = the trained weights "
        "themselves (under autocast when set); bfloat16/float16 = an inference copy cast from the fp32 "
        "master weights after each optimizer step (verl/vLLM style; no per-op casts); auto = bfloat16 "
        "on a CPU with native bf16 (AVX512-BF16/AMX: measured 1.75x faster decoding), else float32 "
        "(on a GPU the bf16 copy decoded no faster for SmolLM2-135M and its RL arms ended lower: "
        "docs/learning.md section 17). Anything below fp32 on either side turns on algorithm.tis=auto",
    )
    device: str = Field(
        "auto",
        description="where the policy runs: auto = cuda when this torch sees a GPU, else cpu (under "
        "torchrun: each rank's cuda:LOCAL_RANK); cpu; cuda; cuda:N",
    )
    lora: LoraSpec | None = Field(
        None,
        description="LoRA adapters through peft (r, alpha, target_modules, dropout); null = full fine-tuning",
    )

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, v: Any) -> Any:
        # null: configs written before ``auto`` existed (their null meant the default device)
        if v is None:
            return "auto"
        if isinstance(v, str):
            return check_device_setting(v)
        return v


class EnvConfig(_Section):
    """The environment: a registered name (``flowgrpo.env.list_envs()``) and its keyword arguments."""

    name: str = "arithmetic"
    kwargs: dict[str, Any] = Field(default_factory=dict)


class PPOConfig(_Section):
    """PPO's critic (``algorithm.name: ppo``; formulas: docs/algorithms.md, "PPO"). Defaults follow
    TRL's ``PPOTrainer`` (gamma 1, lambda 0.95, value clip 0.2, vf_coef 0.1, whitened advantages)."""

    value_model: Literal["separate", "shared"] = Field(
        "separate",
        description="separate: a copy of the policy backbone (or value_model_path) with a value head and "
        "its own optimizer; shared: a value head on the policy's backbone (the value loss trains it too)",
    )
    value_model_path: str | None = Field(
        None, description="a local HF directory whose backbone initialises a separate critic"
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per action token")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda")
    vf_coef: float = Field(0.1, ge=0.0, description="weight of the value loss")
    value_clip: float | None = Field(0.2, gt=0.0, description="PPO2 value clipping; null: plain MSE")
    value_lr: float | None = Field(None, gt=0.0, description="the critic's learning rate (default: train.lr)")
    whiten_advantages: bool = Field(True, description="normalise GAE advantages over the batch")

    @model_validator(mode="after")
    def _path_needs_separate(self) -> PPOConfig:
        if self.value_model_path is not None and self.value_model == "shared":
            raise ValueError(
                f"algorithm.ppo.value_model_path={self.value_model_path!r} initialises a separate critic, "
                "but algorithm.ppo.value_model=shared: set algorithm.ppo.value_model=separate or "
                "algorithm.ppo.value_model_path=null"
            )
        return self


class OverlongConfig(_Section):
    """DAPO's overlong handling, per episode over the action tokens of the whole trajectory
    (docs/algorithms.md, "Overlong episodes")."""

    buffer_len: int = Field(
        0,
        ge=0,
        description="soft overlong punishment: the last buffer_len tokens of the budget ramp "
        "the penalty from 0 to -penalty_factor (DAPO's L_cache); 0 = off",
    )
    penalty_factor: float = Field(1.0, ge=0.0, description="scale of the penalty added to the reward")
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="action-token budget of a trajectory (DAPO's L_max); default "
        "rollout.max_turns * rollout.max_new_tokens",
    )
    mask_truncated: bool = Field(
        False,
        description="overlong filtering: episodes cut for length (termination max_tokens or "
        "context_overflow, or the budget reached) stay in their group's baseline but out of the loss",
    )


# the estimators whose trajectory score takes per-turn rewards (flowgrpo.algorithms.advantages.discounted_score)
TURN_DISCOUNT_ESTIMATORS = ("flow_grpo", "grpo_dr", "gigpo")


class AlgorithmConfig(_Section):
    """Advantage estimator and policy loss (formulas: docs/algorithms.md)."""

    name: Literal["flow_grpo", "ppo"] = Field(
        "flow_grpo",
        description="flow_grpo: group baselines (the estimator below); ppo: a value model and "
        "multi-turn GAE (the ppo section), the same clipped policy loss and KL",
    )
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    estimator: str = Field("flow_grpo", description="a name in flowgrpo.algorithms.advantages.ESTIMATORS")
    estimator_kwargs: dict[str, Any] = Field(default_factory=dict, description="e.g. {gamma: 0.95} for gigpo")
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    clip_high: float = Field(0.28, ge=0.0, description="clip-higher (DAPO): > clip_low favours exploration")
    dual_clip: float | None = Field(None, gt=1.0)
    kl_coef: float = Field(0.001, ge=0.0, description="0 skips the reference model entirely")
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "turn_mean"] = "token_mean"
    norm_len: int | None = Field(None, ge=1, description="seq_mean_token_sum_norm's constant length")
    tis: Literal["auto", "off", "token", "sequence_mask"] = Field(
        "auto",
        description="truncated importance sampling (Yao et al. 2025) between the sampler's and the "
        "trainer's logprobs: token = min(ratio, tis_cap) per token; sequence_mask = drop trajectories "
        "whose mean log-ratio is beyond log(tis_cap); auto = token unless sampler and trainer both run "
        "in fp32 on the hf backend with no async_staleness (they then agree to ~1e-5). The old logprobs "
        "are the trainer's (recomputed with one extra forward pass when a batch gets several optimizer "
        "steps)",
    )
    tis_cap: float = Field(2.0, gt=1.0, description="truncation of the sampler/trainer ratio (TIS's C)")
    loss: Literal["ppo_clip", "gspo", "cispo"] = Field(
        "ppo_clip",
        description="policy-gradient term: ppo_clip (token-level clipped surrogate), gspo (one "
        "length-normalised ratio per turn, clipped per turn; the paper clips at 3e-4/4e-4 with "
        "agg=turn_mean), cispo (clipped stop-gradient IS weight on REINFORCE); docs/algorithms.md",
    )

    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    entropy_coef: float = Field(
        0.0, ge=0.0, description="entropy bonus: - entropy_coef * H per action token (0 = off)"
    )
    entropy_top_q: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="policy gradient only on the top-q fraction of highest-entropy action tokens of "
        "the batch (Wang et al. 2025's 80/20 rule: 0.2); null = every token",
    )
    turn_discount: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="per-turn rewards (Turn.reward) discounted toward the outcome join the score each "
        "trajectory is compared on: S = R + sum_t turn_discount^(T-1-t) r_t (flow_grpo, grpo_dr, gigpo); "
        "null = the outcome alone",
    )
    exclude_terminations: list[Termination] = Field(
        default_factory=list,
        description="episodes that ended this way leave the update and their group's baseline "
        "(e.g. [error, context_overflow]); a group left with < 2 episodes contributes nothing",
    )

    @field_validator("exclude_terminations")
    @classmethod
    def _not_finished(cls, v: list[Termination]) -> list[Termination]:
        if Termination.finished in v:
            raise ValueError(
                "excluding 'finished' episodes would drop every episode that ended normally; list only "
                f"failure modes: {[t.value for t in Termination if t is not Termination.finished]}"
            )
        return v

    @model_validator(mode="after")
    def _dual_clip_needs_ppo_clip(self) -> AlgorithmConfig:
        if self.dual_clip is not None and self.loss != "ppo_clip":
            raise ValueError(
                f"algorithm.dual_clip={self.dual_clip} applies to algorithm.loss=ppo_clip only, not "
                f"algorithm.loss={self.loss}: set algorithm.dual_clip=null or algorithm.loss=ppo_clip"
            )
        return self

    @model_validator(mode="after")
    def _turn_discount_estimators(self) -> AlgorithmConfig:
        if self.turn_discount is None:
            return self
        if self.name == "ppo":
            raise ValueError(
                "algorithm.turn_discount applies to the group estimators; PPO discounts per-turn rewards "
                "in its GAE (algorithm.ppo.gamma): set algorithm.turn_discount=null"
            )
        if self.estimator not in TURN_DISCOUNT_ESTIMATORS:
            raise ValueError(
                f"algorithm.turn_discount is supported by the estimators {list(TURN_DISCOUNT_ESTIMATORS)}, "
                f"not {self.estimator!r}: change algorithm.estimator or set algorithm.turn_discount=null"
            )
        if "turn_discount" in self.estimator_kwargs:
            raise ValueError(
                "turn_discount is set both as algorithm.turn_discount and in algorithm.estimator_kwargs: "
                "keep algorithm.turn_discount only"
            )
        return self

    @field_validator("tis", mode="before")
    @classmethod
    def _tis_off_is_not_false(cls, v: Any) -> Any:
        return (
            "off" if v is False else v
        )  # YAML 1.1 reads a bare `off` (tis: off, --set algorithm.tis=off) as false

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, v: str) -> str:
        from flowgrpo.algorithms.advantages import get_estimator

        get_estimator(v)  # raises with the list of valid names
        return v


class TrainSection(_Section):
    """The optimisation loop."""

    steps: int = Field(100, ge=1, description="RL steps (rollout batch + updates)")
    tasks_per_step: int = Field(8, ge=1)
    group_size: int = Field(4, ge=1, description="episodes per task (G)")
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    grad_clip: float | None = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(4096, ge=1, description="padded tokens per forward/backward")
    epochs_per_batch: int = Field(1, ge=1, description="passes over each rollout batch")
    minibatches_per_batch: int = Field(1, ge=1, description="optimizer steps per pass")
    drop_zero_variance_groups: bool = Field(True, description="groups with equal rewards carry no signal")
    resample_rounds: int = Field(
        0,
        ge=0,
        description="DAPO's dynamic sampling: up to this many extra rollout rounds per step, each on "
        "as many fresh tasks as groups were dropped for equal rewards, to refill the update batch",
    )
    pack_rows: bool = Field(True, description="one row per episode (prefix merging)")
    async_staleness: int = Field(
        0,
        ge=0,
        description="0: rollout then update (synchronous); k >= 1: a rollout thread samples steps t+1..t+k "
        "while step t updates, trajectories more than k versions old are dropped, and algorithm.tis "
        "corrects the loss for the lag (required)",
    )
    parallel: Literal["ddp", "fsdp2"] = Field(
        "ddp",
        description="under torchrun: ddp (every rank holds the whole model, its gradients and AdamW's "
        "moments; gradients summed) or fsdp2 (FSDP2 shards the trained parameters, gradients and "
        "moments across ranks; rollout samples a full copy refreshed after each update); "
        "docs/scaling.md",
    )
    logprob_chunk: int = Field(1024, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _resample_needs_dropping(self) -> TrainSection:
        if self.resample_rounds and not self.drop_zero_variance_groups:
            raise ValueError(
                f"train.resample_rounds={self.resample_rounds} refills groups dropped for equal rewards, but "
                "train.drop_zero_variance_groups=false drops none: set train.drop_zero_variance_groups=true "
                "or train.resample_rounds=0"
            )
        return self


class RunSection(_Section):
    """Outputs, checkpoints, logging."""

    output_dir: str = "runs/default"
    save_every: int = Field(10, ge=0, description="steps between checkpoints (0: only at the end)")
    keep_last: int = Field(2, ge=1, description="checkpoints kept on disk")
    resume: bool | str = Field(False, description="true: the latest checkpoint in output_dir; or a path")
    resume_fallback: bool = Field(
        False, description="resume from the previous checkpoint when the latest is unreadable"
    )
    start_over: bool = Field(
        False, description="resume with no checkpoint left: start from step 0, moving old records aside"
    )
    save_trajectories: bool = True
    log_to: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["jsonl"],
        description="where step metrics go: jsonl (RUN/metrics.jsonl, always written), tensorboard "
        "(RUN/tensorboard), wandb (needs wandb installed; WANDB_MODE=offline respected)",
    )
    progress: bool = True
    eval_every: int = Field(0, ge=0, description="steps between evaluations (0: off)")
    eval_n: int | None = Field(None, ge=1, description="test tasks per evaluation (default: all)")

    @model_validator(mode="before")
    @classmethod
    def _tensorboard_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tensorboard" in data:
            raise ValueError(
                "run.tensorboard was replaced by run.log_to: write run.log_to=[jsonl, tensorboard] "
                "(or drop the key)"
            )
        return data


class SFTSection(_Section):
    """Optional supervised warm start on demonstrations (the environment's oracle, run through the
    rollout engine's text-policy path) before RL: small models that never follow the tool-call
    format unaided get a policy whose samples sometimes earn reward."""

    enabled: bool = False
    tasks: int = Field(32, ge=1, description="train tasks to demonstrate")
    epochs: int = Field(2, ge=1)
    lr: float = Field(1e-4, gt=0)
    batch_trajectories: int = Field(8, ge=1, description="trajectories per optimizer step")
    only_successful: bool = Field(True, description="keep demonstrations whose reward is > 0")
    replay_coef: float = Field(
        0.0,
        ge=0,
        description="during RL, add this x the demonstrations' mean token NLL to every optimizer step "
        "(InstructGPT's PPO-ptx): holds what the warm start taught on tasks whose groups carry no signal",
    )
    replay_trajectories: int = Field(8, ge=1, description="demonstrations replayed per optimizer step")


class TrainConfig(_Section):
    """The whole run."""

    @property
    def action_token_budget(self) -> int:
        """The action tokens one trajectory may sample: ``algorithm.overlong.max_tokens`` or
        ``rollout.max_turns * rollout.max_new_tokens``."""
        return self.algorithm.overlong.max_tokens or self.rollout.max_turns * self.rollout.max_new_tokens

    @model_validator(mode="after")
    def _overlong_buffer_fits(self) -> TrainConfig:
        b = self.algorithm.overlong.buffer_len
        if b and b >= self.action_token_budget:
            raise ValueError(
                f"algorithm.overlong.buffer_len={b} must be smaller than the trajectory's action-token "
                f"budget {self.action_token_budget} (algorithm.overlong.max_tokens, default "
                "rollout.max_turns * rollout.max_new_tokens); lower it or raise the budget"
            )
        return self

    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    rewards: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(name="accuracy")])
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainSection = Field(default_factory=TrainSection)
    run: RunSection = Field(default_factory=RunSection)
    sft: SFTSection = Field(default_factory=SFTSection)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.algorithm.name == "flow_grpo" and self.train.group_size < 2:
            raise ValueError(
                f"train.group_size={self.train.group_size} leaves every episode alone in its group: the "
                f"group estimator ({self.algorithm.estimator}) gives it advantage 0 and nothing is "
                "learned; set train.group_size to 2 or more, or algorithm.name=ppo"
            )
        if self.train.minibatches_per_batch > self.train.tasks_per_step * self.train.group_size:
            raise ValueError(
                f"train.minibatches_per_batch={self.train.minibatches_per_batch} exceeds the trajectories per "
                f"step ({self.train.tasks_per_step} x {self.train.group_size}); lower it"
            )
        if self.train.async_staleness and self.algorithm.tis == "off":  # auto turns it on
            raise ValueError(
                f"train.async_staleness={self.train.async_staleness} trains on samples of older policies: "
                "set algorithm.tis=token (or sequence_mask) so the loss corrects for it"
            )
        if self.sft.replay_coef and not self.sft.enabled:
            raise ValueError(
                f"sft.replay_coef={self.sft.replay_coef} replays the warm start's demonstrations: set "
                "sft.enabled=true (its tasks, only_successful) or sft.replay_coef=0"
            )
        return self


# --------------------------------------------------------------------------------------------
# Loading, overrides, readable errors.


def _model_for(path: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The pydantic class that holds the field at ``path`` (for listing valid keys)."""
    cls: Any = TrainConfig
    for p in path:
        if isinstance(p, int) or not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            if cls is not None and hasattr(cls, "__args__"):
                cls = cls.__args__[0]
            continue
        field = cls.model_fields.get(p)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            cls = ann
        elif args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            cls = args[0]  # list[RewardSpec]
        else:
            cls = None
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


# A value quoted back in an error is cut to this many characters: the message names the offending
# key and the fix; a whole section echoed back (kilobytes of nested dicts) hides both.
_SHOWN_CHARS = 60


def _shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`_SHOWN_CHARS` characters."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _explain_one(err: Any) -> str:
    """One validation error as ``key: what is wrong (got value); how to fix it``."""
    loc = tuple(err["loc"])
    dotted = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        parent = _model_for(loc[:-1])
        valid = sorted(parent.model_fields) if parent else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"did you mean {'.'.join(map(str, (*loc[:-1], close[0])))!r}? " if close else ""
        foreign = key_hint(str(loc[-1]))
        hint = f"{foreign}; " if foreign else hint
        return f"{dotted}: unknown key; {hint}valid keys here: {', '.join(valid)}"
    foreign = value_hint(str(loc[-1]), err.get("input")) if loc else None
    hint = f"; {foreign}" if foreign else ""
    if err["type"] == "value_error":
        # Our validators write the whole message: the keys, their values and the fix. The input is
        # the validated section (the whole config for a cross-section check), never worth echoing.
        msg = str(err["ctx"]["error"]) if "ctx" in err else err["msg"].removeprefix("Value error, ")
        named = not dotted or msg.startswith(dotted) or f"{dotted}." in msg or f"{dotted}=" in msg
        return (msg if named else f"{dotted}: {msg}") + hint
    section = _model_for(loc) if err["type"] in ("model_type", "model_attributes_type") else None
    if section is not None:
        keys = ", ".join(sorted(section.model_fields))
        return (
            f"{dotted} is a section, not a value (got {_shown(err.get('input'))}): set one of its keys "
            f"({dotted}.KEY=VALUE), where KEY is one of {keys}"
        )
    got = "" if err["type"] == "missing" else f" (got {_shown(err.get('input'))})"
    return f"{dotted or 'the configuration'}: {err['msg']}{got}{hint}"


def _explain(e: ValidationError) -> str:
    """Every error of ``e``, one line in all (the CLI prints it as its one line on stderr)."""
    lines = [_explain_one(err) for err in e.errors()]
    if len(lines) == 1:
        return f"invalid configuration: {lines[0]}"
    return f"invalid configuration ({len(lines)} errors): " + "; ".join(lines)


def _yaml_problem(e: Exception) -> str:
    """A YAML parse error as ``line L, column C: problem`` (PyYAML's own text spans several lines,
    quotes the source and names ``<unicode string>`` instead of the file)."""
    import yaml

    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        context = f" ({e.context})" if e.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {e.problem}{context}"
    return " ".join(str(e).split())


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.lr=1e-5"`` -> ``(["train", "lr"], 1e-5)``; the value is parsed as YAML."""
    import yaml

    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value (e.g. train.lr=1e-5)")
    key, _, raw = text.partition("=")
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(
            f"override {text!r}: the value is not valid YAML ({_yaml_problem(e)}); quote a string "
            f"that holds YAML punctuation: --set {key.strip()}='\"...\"'"
        ) from None
    if isinstance(value, str) and value.lower() in ("none", "null"):
        value = None
    return path, value


def _list_index(items: list[Any], key: str, text: str, where: str, *, last: bool) -> int:
    """The index ``key`` names in the list at ``where``; the last path element may be ``len(items)``
    (appends an item: ``rewards.2={name: turn_cost, weight: 0.05}``)."""
    top = len(items) if last else len(items) - 1
    if not key.isdigit() or int(key) > top:
        append = f"; {where}.{len(items)}=VALUE appends one" if last else ""
        raise ConfigError(
            f"override {text!r}: {where} is a list of {len(items)} item(s): index it with 0..{len(items) - 1}"
            f"{append}, or set the whole list ({where}=[...])"
        )
    return int(key)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each dotted override in the nested dict ``data`` (in place; list items by index, and
    one past the end of a list appends)."""
    for text in overrides:
        path, value = parse_override(text)
        node: Any = data
        for i, p in enumerate(path[:-1]):
            if isinstance(node, list):
                node = node[_list_index(node, p, text, ".".join(path[:i]), last=False)]
                continue
            if p not in node or node[p] is None:
                node[p] = {}
            if not isinstance(node[p], dict | list):
                raise ConfigError(f"override {text!r}: {'.'.join(path[: i + 1])} is a value, not a section")
            node = node[p]
        last = path[-1]
        if isinstance(node, list):
            k = _list_index(node, last, text, ".".join(path[:-1]), last=True)
            node[k : k + 1] = [value]
        else:
            node[last] = value
    return data


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(e)) from None


def upgrade_saved_config(data: dict[str, Any]) -> list[str]:
    """Rewrite, in place, the keys a run's saved ``config.yaml`` used before they were renamed, so
    that replay, report and eval keep working on older runs; returns what was rewritten. (A config
    a user writes gets an error that names the new key instead.)"""
    changed = []
    run = data.get("run")
    if isinstance(run, dict) and "tensorboard" in run:
        run.setdefault("log_to", ["jsonl", "tensorboard"] if run.pop("tensorboard") else ["jsonl"])
        changed.append("run.tensorboard -> run.log_to")
    return changed


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """A :class:`TrainConfig` from a YAML file (or the defaults) plus dotted overrides."""
    import yaml

    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{p} is not valid YAML: {_yaml_problem(e)}") from None
        if data is None:  # an empty file is a mistake, not a request for a default 100-step run
            raise ConfigError(
                f"{p} is empty: write the sections you change (model, env, train, ...; see examples/), "
                "or pass no config file to train with the defaults"
            )
        if not isinstance(data, dict):
            raise ConfigError(f"{p} must hold a mapping of sections (model, env, train, ...)")
    if overrides:
        # Overrides apply on top of the defaults, so `rewards.0.weight=2` works without a file.
        data = _merge(TrainConfig().model_dump(mode="json", exclude_unset=False), data)
        apply_overrides(data, list(overrides))
    return config_from_dict(data)


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: mappings merge recursively, anything else (lists too) replaces."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def dump_config(cfg: TrainConfig, path: str | Path) -> None:
    import yaml

    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


__all__ = [
    "AgentConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CurriculumConfig",
    "EnvConfig",
    "ModelConfig",
    "PPOConfig",
    "RunSection",
    "SFTSection",
    "TrainConfig",
    "TrainSection",
    "apply_overrides",
    "config_from_dict",
    "dump_config",
    "load_config",
    "parse_override",
]
