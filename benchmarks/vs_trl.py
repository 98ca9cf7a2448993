"""flowgrpo vs TRL's ``GRPOTrainer``: seconds per training step, completion tokens/s and peak RSS
on the identical task, both sides in one run, alternating.

What is identical on both sides
- the model object: ``flowgrpo.modeling.models.load_model("smollm2-135m")`` (the embedded SmolLM2-135M-Instruct;
  TRL takes the model object and the tokenizer as ``processing_class``; nothing comes from a hub);
- the prompts (arithmetic word problems from ``flowgrpo.envs.arithmetic``, the same tasks in the
  same order: step ``i`` uses tasks ``2i`` and ``2i+1``), rendered by the same chat template;
- group size 4, 2 prompts per step (8 completions), at most 64 completion tokens (single-turn);
- sampling: temperature 1.0, top-p 1.0, top-k off; AdamW, learning rate 1e-6, no weight decay,
  gradient clipping at 1.0; no KL term and no reference model (TRL's default ``beta=0``);
- the loss aggregation (a token mean over the batch: TRL's default ``loss_type="dapo"`` is ours
  ``agg="token_mean"``), one forward + backward per step (TRL ``num_iterations=1`` reuses the
  step's own logprobs as the old ones; we use the sampler's), every row trained on, even
  zero-advantage ones;
- the accuracy reward (``flowgrpo.rewards.AccuracyReward`` on the final ``<answer>`` tag);
- the environment: ``GLIBC_TUNABLES`` malloc tuning (see :mod:`benchmarks._common`), 2 threads.

Precision modes (``--precision``; ``auto`` = ``bf16`` and ``amp`` where bf16 matmuls are fast --
a CUDA GPU or a CPU with avx512_bf16/AMX -- else ``fp32``)
- ``fp32``: fp32 weights, no autocast, on both sides (the only sensible setting on an AVX2-only
  CPU, where PyTorch's bf16 matmul falls back to a path ~300x slower than fp32).
- ``bf16``: model weights in bfloat16 on both sides (TRL's fastest setting here; pure-bf16 weights
  barely move at lr 1e-6, so this is a speed figure only).
- ``amp``: fp32 master weights + bf16 autocast on both sides (TRL ``bf16=True``; ours
  ``HFBackend(autocast_dtype="bfloat16")`` + ``action_logprobs(autocast_dtype="bfloat16")``):
  the like-for-like "it learns" comparison.
TRL runs at its best settings measured on this machine: no gradient checkpointing (its default is
on, and costs ~30%), ``use_cpu=True``.

Multi-turn (``--task multi``): TRL's tool-calling path (``tools=[calculator]``, a chat template that
renders tools -- TRL's own ``qwen2_5`` template, which uses SmolLM2's ``<|im_start|>``/``<|im_end|>``
tokens -- up to 3 tool-calling iterations, ``max_completion_length=128`` for the whole completion
including tool results) vs flowgrpo's ``arithmetic`` environment with the same calculator, the
same template (rendered natively by :class:`flowgrpo.chat.format.ChatFormat`), up to 4 turns of up to 128
tokens each and a context limit of the longest prompt + 128 tokens, so our token budget per episode
is at least TRL's.

Our step (``FlowGRPOSide.step``) is one ``flowgrpo.training.trainer.Trainer.train_step()``: rollout of the
groups with :class:`~flowgrpo.rollout.backends.hf.HFBackend` through :class:`~flowgrpo.rollout.engine.RolloutEngine`,
rewards, ``flow_grpo`` advantages, packed rows, :func:`~flowgrpo.modeling.logprobs.action_logprobs` +
:func:`~flowgrpo.algorithms.loss.policy_loss`, backward, clip, AdamW step, metrics and the step's trajectories
written to JSONL. Settings matched to TRL: ``clip_high=0.2`` (TRL's ``epsilon_high`` defaults to
``epsilon``), ``kl_coef=0`` (no reference model), ``tis="off"``, a constant learning rate, and
``drop_zero_variance_groups=False`` -- our default skips the update for groups whose rewards are all
equal (no gradient signal), which would make our step cheaper than TRL's for a reason that is not
speed; here every completion is trained on, as in TRL. The task stream is replaced by the fixed
order both sides share.

Measurement: each side runs in its own subprocess per measurement (so peak RSS, from
``os.wait4``, is that side's own), sides alternate A/B/B/A..., every child does 1 warm-up step then
``--steps`` timed steps; medians are over all timed steps of a side. The machine is shared (2
cores, other jobs running): quote the ratio, not the absolute seconds.

    python -m benchmarks.vs_trl --task single        # 2 rounds x 3 timed steps per side
    python -m benchmarks.vs_trl --task multi
    python -m benchmarks.vs_trl --quick              # 1 round x 2 timed steps, single-turn
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/vs_trl.py` as well as `python -m benchmarks.vs_trl`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import (
    ChildResult,
    child_env,
    fmt_table,
    load_policy,
    machine_info,
    median,
    run_child,
    set_threads,
    write_child_result,
)

SINGLE_SYSTEM = "Solve the math problem. Give the final answer as <answer>N</answer>."


@dataclass
class BenchConfig:
    """The settings both sides share."""

    task: str = "single"  # single | multi
    precision: str = "fp32"  # fp32 | bf16 | amp
    model: str = "smollm2-135m"
    device: str = "cpu"
    prompts_per_step: int = 2
    group_size: int = 4
    max_completion_tokens: int = 64  # single: per completion; multi: TRL's whole-completion budget
    max_turns: int = 4  # multi only: TRL gets max_turns - 1 tool-calling iterations
    learning_rate: float = 1e-6
    temperature: float = 1.0
    seed: int = 0
    threads: int | None = None

    @property
    def num_completions(self) -> int:
        return self.prompts_per_step * self.group_size


def bench_tasks(n: int, seed: int = 0) -> list[Any]:
    """The arithmetic word problems both sides train on, in order."""
    from flowgrpo.envs.arithmetic import ArithmeticEnv

    return ArithmeticEnv(seed=seed, tools=[], num_train=max(n, 8), num_test=8).tasks("train")[:n]


def step_tasks(tasks: list[Any], step: int, k: int) -> list[Any]:
    """Tasks of step ``step``: ``k`` consecutive ones (wrapping around)."""
    return [tasks[(step * k + j) % len(tasks)] for j in range(k)]


def multi_turn_template() -> str:
    """TRL's Qwen2.5 chat template (renders ``tools=``, tool calls and tool results; its special
    tokens ``<|im_start|>``/``<|im_end|>`` are SmolLM2's)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def make_env(cfg: BenchConfig):
    """A fresh environment for one episode."""
    from flowgrpo.envs.arithmetic import ArithmeticEnv

    if cfg.task == "single":
        return ArithmeticEnv(seed=cfg.seed, tools=[], system_prompt=SINGLE_SYSTEM)
    return ArithmeticEnv(seed=cfg.seed)


def opening_messages(cfg: BenchConfig, task: Any) -> list[dict[str, str]]:
    """The prompt both sides start from (system + user), as chat dicts."""
    env = make_env(cfg)
    return [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": env.user_prompt(task)},
    ]


# ---------------------------------------------------------------------------------------------
# Our side
# ---------------------------------------------------------------------------------------------


@dataclass
class StepStats:
    seconds: float
    completion_tokens: int
    reward_mean: float
    rows: int
    train_tokens: int
    phases: dict[str, float] = field(default_factory=dict)


class _FixedOrder:
    """The trainer's task stream replaced by the benchmark's fixed order (the same tasks TRL sees)."""

    def __init__(self, tasks: list[Any], k: int) -> None:
        self.tasks, self.k, self.i = tasks, k, 0

    def next(self, n: int) -> list[Any]:
        out = step_tasks(self.tasks, self.i, n)
        self.i += 1
        return out

    def observe(self, groups: Any) -> None:
        """The fixed order ignores outcomes (flowgrpo.algorithms.curriculum.TaskSampler)."""

    def set_tasks(self, tasks: list[Any], stage: int) -> None:
        raise ValueError("the benchmark's fixed task order has no difficulty stages (curriculum.difficulty)")

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i}

    def load_state_dict(self, s: dict[str, int]) -> None:
        self.i = int(s["i"])


def train_config(cfg: BenchConfig, tasks: list[Any], tokenizer: Any, out_dir: str) -> Any:
    """flowgrpo's :class:`~flowgrpo.config.TrainConfig` for ``cfg``, matched to TRL's settings."""
    from flowgrpo.config import TrainConfig
    from flowgrpo.rollout.backends.base import SamplingParams

    sampling = SamplingParams(temperature=cfg.temperature, top_p=1.0, top_k=0, seed=cfg.seed)
    if cfg.task == "single":
        rollout = {"max_turns": 1, "max_new_tokens": cfg.max_completion_tokens, "max_context_tokens": 4096}
    else:
        longest = max(len(prompt_ids(cfg, tokenizer, t)) for t in tasks)
        rollout = {
            "max_turns": cfg.max_turns,
            "max_new_tokens": cfg.max_completion_tokens,
            "max_context_tokens": longest + cfg.max_completion_tokens,
        }
    return TrainConfig.model_validate(
        {
            "model": {
                "name": cfg.model,
                "dtype": "bfloat16" if cfg.precision == "bf16" else "float32",
                "autocast": "bfloat16" if cfg.precision == "amp" else None,
            },
            "env": {"name": "arithmetic"},
            "rollout": {**rollout, "sampling": sampling.model_dump()},
            "rewards": [{"name": "accuracy"}],
            "algorithm": {
                "estimator": "flow_grpo",
                "clip_low": 0.2,
                "clip_high": 0.2,
                "kl_coef": 0.0,
                "tis": "off",
                "agg": "token_mean",
            },
            "train": {
                "steps": 10_000,
                "tasks_per_step": cfg.prompts_per_step,
                "group_size": cfg.group_size,
                "lr": cfg.learning_rate,
                "weight_decay": 0.0,
                "betas": (0.9, 0.999),
                "lr_schedule": "constant",
                "grad_clip": 1.0,
                "micro_batch_tokens": 8192,
                "epochs_per_batch": 1,
                "minibatches_per_batch": 1,
                # TRL trains on every completion, so do we (our default skips zero-variance groups).
                "drop_zero_variance_groups": False,
                "pack_rows": True,
                "seed": cfg.seed,
            },
            "run": {"output_dir": out_dir, "save_every": 0, "progress": False},
        }
    )


def prompt_ids(cfg: BenchConfig, tokenizer: Any, task: Any) -> list[int]:
    """Our rendering of a task's opening prompt (to size the multi-turn context budget)."""
    from flowgrpo.chat.format import ChatFormat
    from flowgrpo.types import Message

    env = make_env(cfg)
    chat = ChatFormat(tokenizer, tools=list(env.tools), parser=env.parser)
    return chat.initial_ids(chat.prompt_messages([Message(**m) for m in opening_messages(cfg, task)]))


class FlowGRPOSide:
    """flowgrpo's :class:`~flowgrpo.training.trainer.Trainer` on ``cfg``'s task; :meth:`step` is one
    ``Trainer.train_step()`` (rollout, rewards, advantages, packed rows, update, metrics and the
    step's trajectories written to JSONL, as in a real run; no checkpoint, like TRL's
    ``save_strategy="no"``)."""

    def __init__(self, model: Any, tokenizer: Any, cfg: BenchConfig, tasks: list[Any], out_dir: str) -> None:
        from flowgrpo.training.trainer import Trainer

        self.cfg = cfg
        tc = train_config(cfg, tasks, tokenizer, out_dir)
        self.trainer = Trainer(tc, model=model, tokenizer=tokenizer, env_factory=lambda: make_env(cfg))
        self.trainer.stream = _FixedOrder(tasks, cfg.prompts_per_step)

    def step(self, i: int) -> StepStats:
        t0 = time.perf_counter()
        m = self.trainer.train_step()
        if self.cfg.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
        return StepStats(
            seconds=time.perf_counter() - t0,
            completion_tokens=int(m["action_tokens"]),
            reward_mean=float(m["reward_mean"]),
            rows=int(m.get("groups_trained", 0) * self.cfg.group_size),
            train_tokens=int(m.get("train_tokens", 0)),
            phases={
                "rollout": m["time/rollout_s"],
                "update": m["time/update_s"],
                "other": m["time/step_s"] - m["time/rollout_s"] - m["time/update_s"],
            },
        )


def _setup_side(cfg: BenchConfig, n_steps: int) -> tuple[Any, Any, list[Any]]:
    """What both sides start from, identically: threads, seed, the policy, its chat template and
    the tasks of ``n_steps`` steps (model load time counts in each side's setup_s)."""
    import torch

    set_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model, tok = load_policy(
        cfg.model,
        dtype="bfloat16" if cfg.precision == "bf16" else "float32",
        device=cfg.device,
        seed=cfg.seed,
    )
    if cfg.task == "multi":
        tok.chat_template = multi_turn_template()
    return model, tok, bench_tasks(cfg.prompts_per_step * n_steps, cfg.seed)


def run_flowgrpo(cfg: BenchConfig, steps: int, warmup: int = 1) -> dict[str, Any]:
    """Load the model, run ``warmup`` + ``steps`` steps; per-step stats of the timed ones."""
    t0 = time.perf_counter()
    model, tok, tasks = _setup_side(cfg, steps + warmup)
    with tempfile.TemporaryDirectory(prefix="flowgrpo-bench-run-") as out_dir:
        side = FlowGRPOSide(model, tok, cfg, tasks, out_dir)
        setup_s = time.perf_counter() - t0
        stats = [side.step(i) for i in range(warmup + steps)]
    timed = stats[warmup:]
    return {
        "side": "flowgrpo",
        "setup_s": setup_s,
        "step_s": [s.seconds for s in timed],
        "completion_tokens": [s.completion_tokens for s in timed],
        "reward_mean": [s.reward_mean for s in timed],
        "train_tokens": [s.train_tokens for s in timed],
        "phases": [s.phases for s in timed],
        "warmup_s": [s.seconds for s in stats[:warmup]],
    }


# ---------------------------------------------------------------------------------------------
# TRL's side
# ---------------------------------------------------------------------------------------------


def trl_calculator():
    """The calculator as a TRL tool: an async function with a typed, documented signature that
    calls flowgrpo's own calculator (so both sides compute the same observations)."""
    from flowgrpo.tools.calculator import Calculator

    from flowgrpo.tool import ToolError, invoke

    calc = Calculator()

    async def calculator(expression: str) -> str:
        """Evaluate a math expression exactly (fractions, powers, sqrt, sin, log, %).

        Args:
            expression: A math expression, e.g. 391/4 or sqrt(2)*3 or 15% of 80
        """
        try:
            return (await invoke(calc, {"expression": expression})).content
        except ToolError as e:
            return f"Error: {e}"

    return calculator


def trl_reward(tasks: list[Any]):
    """TRL reward function: flowgrpo's accuracy on the final ``<answer>`` of the completion."""
    from flowgrpo.chat.parsing import extract_answer
    from flowgrpo.rewards import AccuracyReward

    acc = AccuracyReward()
    by_id = {t.id: t for t in tasks}

    def accuracy(prompts, completions, task_id, **kw) -> list[float]:
        out = []
        for c, tid in zip(completions, task_id, strict=True):
            if isinstance(c, list):  # conversational: the last assistant message
                texts = [m.get("content") or "" for m in c if m.get("role") == "assistant"]
                text = texts[-1] if texts else ""
            else:
                text = c
            out.append(acc.score_answer(extract_answer(text), by_id[tid]))
        return out

    return accuracy


def run_trl(cfg: BenchConfig, steps: int, warmup: int = 1) -> dict[str, Any]:
    """TRL's GRPOTrainer for ``warmup + steps`` optimizer steps; per-step times from a callback."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    t0 = time.perf_counter()
    n = warmup + steps
    model, tok, tasks = _setup_side(cfg, n)
    ds = Dataset.from_list([{"prompt": opening_messages(cfg, t), "task_id": t.id} for t in tasks])

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.t: float | None = None
            self.step_s: list[float] = []
            self.logs: list[dict[str, float]] = []

        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if self.t is not None:
                self.step_s.append(time.perf_counter() - self.t)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                self.logs.append({k: v for k, v in logs.items() if isinstance(v, int | float)})

    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=cfg.num_completions,
            num_generations=cfg.group_size,
            max_completion_length=cfg.max_completion_tokens,
            learning_rate=cfg.learning_rate,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            max_grad_norm=1.0,
            temperature=cfg.temperature,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            loss_type="dapo",
            gradient_checkpointing=False,
            bf16=cfg.precision == "amp",
            use_cpu=cfg.device == "cpu",
            max_steps=n,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            shuffle_dataset=False,
            seed=cfg.seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
            max_tool_calling_iterations=cfg.max_turns - 1 if cfg.task == "multi" else None,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=trl_reward(tasks),
            args=args,
            train_dataset=ds,
            processing_class=tok,
            tools=[trl_calculator()] if cfg.task == "multi" else None,
            callbacks=[timer],
        )
        setup_s = time.perf_counter() - t0
        trainer.train()
    step_logs = [lg for lg in timer.logs if "completions/mean_length" in lg]
    tokens = [round(lg["completions/mean_length"] * cfg.num_completions) for lg in step_logs]
    rewards = [float(lg.get("reward", float("nan"))) for lg in step_logs]
    return {
        "side": "trl",
        "setup_s": setup_s,
        "step_s": timer.step_s[warmup:],
        "completion_tokens": tokens[warmup:],
        "reward_mean": rewards[warmup:],
        "warmup_s": timer.step_s[:warmup],
    }


# ---------------------------------------------------------------------------------------------
# Parent: alternate the sides, summarise
# ---------------------------------------------------------------------------------------------


@dataclass
class SideSummary:
    side: str
    median_step_s: float
    steps_per_s: float
    completion_tok_per_s: float
    peak_rss_gb: float
    n_steps: int
    step_s: list[float]

    @classmethod
    def of(cls, side: str, results: list[ChildResult]) -> SideSummary:
        step_s = [s for r in results for s in r.payload["step_s"]]
        toks = [t for r in results for t in r.payload["completion_tokens"]]
        tok_s = [t / s for t, s in zip(toks, step_s, strict=False) if s > 0]
        med = median(step_s)
        return cls(
            side, med, 1.0 / med, median(tok_s), max(r.peak_rss_gb for r in results), len(step_s), step_s
        )


def compare(
    cfg: BenchConfig, *, rounds: int, steps: int, malloc_tuned: bool = True, timeout_s: float = 900
) -> dict[str, Any]:
    """Alternate TRL and flowgrpo children ``rounds`` times; returns both summaries and the ratios."""
    env = child_env(malloc_tuned=malloc_tuned, threads=cfg.threads)
    base = [
        "--task",
        cfg.task,
        "--precision",
        cfg.precision,
        "--model",
        cfg.model,
        "--device",
        cfg.device,
        "--steps",
        str(steps),
        "--seed",
        str(cfg.seed),
    ]
    if cfg.threads:
        base += ["--threads", str(cfg.threads)]
    got: dict[str, list[ChildResult]] = {"trl": [], "flowgrpo": []}
    for r in range(rounds):
        order = ["trl", "flowgrpo"] if r % 2 == 0 else ["flowgrpo", "trl"]
        for side in order:
            t0 = time.monotonic()
            res = run_child("benchmarks.vs_trl", [*base, "--side", side], env=env, timeout_s=timeout_s)
            got[side].append(res)
            print(
                f"  [{cfg.task}/{cfg.precision}] round {r + 1}/{rounds} {side:8s}: steps "
                + ", ".join(f"{s:.2f}" for s in res.payload["step_s"])
                + f" s, peak RSS {res.peak_rss_gb:.2f} GB ({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
    trl, ours = SideSummary.of("trl", got["trl"]), SideSummary.of("flowgrpo", got["flowgrpo"])
    return {
        "config": asdict(cfg),
        "rounds": rounds,
        "steps_per_child": steps,
        "malloc_tuned": malloc_tuned,
        "trl": asdict(trl),
        "flowgrpo": asdict(ours),
        "speedup_steps_per_s": ours.steps_per_s / trl.steps_per_s,
        "speedup_tok_per_s": ours.completion_tok_per_s / trl.completion_tok_per_s,
        "rss_ratio": ours.peak_rss_gb / trl.peak_rss_gb,
        "phases": [p for r in got["flowgrpo"] for p in r.payload.get("phases", [])],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--task", choices=["single", "multi", "all"], default="single")
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "amp", "all"],
        default="auto",
        help="auto: bf16+amp where bf16 is fast (GPU, avx512_bf16/AMX CPU), else fp32; all: all three",
    )
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m | random-0.5b (GPU) | tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=2, help="A/B rounds (each side once per round)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per child (after 1 warm-up)")
    p.add_argument("--quick", action="store_true", help="1 round of 2 timed steps, single-turn")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-malloc-tuning", action="store_true")
    p.add_argument("--child-timeout", type=float, default=1800, help="seconds before a child is killed")
    p.add_argument("--json", default=None, help="write the summaries here")
    # child mode
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--side", choices=["trl", "flowgrpo"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.child:
        cfg = BenchConfig(
            task=a.task,
            precision=a.precision,
            model=a.model,
            device=a.device,
            seed=a.seed,
            threads=a.threads,
            max_completion_tokens=64 if a.task == "single" else 128,
        )
        fn = run_trl if a.side == "trl" else run_flowgrpo
        write_child_result(a.out, fn(cfg, a.steps))
        return 0

    if a.quick:
        a.rounds, a.steps = 1, 2
        if a.task == "all":
            a.task = "single"
    from flowgrpo.modeling.hardware import fast_bf16

    native_bf16 = fast_bf16(a.device)
    if a.precision == "auto":
        precs = (["bf16"] if a.quick else ["bf16", "amp"]) if native_bf16 else ["fp32"]
    else:
        precs = ["fp32", "bf16", "amp"] if a.precision == "all" else [a.precision]
    if not native_bf16 and any(p_ in ("bf16", "amp") for p_ in precs):
        print(
            "warning: this CPU has no avx512_bf16/AMX: bf16 matmuls take a slow fallback path here; "
            "bf16/amp figures will be dominated by it (use --precision fp32)"
        )
    tasks = ["single", "multi"] if a.task == "all" else [a.task]
    info = machine_info()
    print(
        f"machine: {info.get('cpu')} ({info.get('cores')} cores), torch {info.get('torch')}, "
        f"malloc tuned: {not a.no_malloc_tuning}; {a.rounds} round(s) x {a.steps} timed steps per side"
    )
    results = []
    for task in tasks:
        for prec in precs:
            cfg = BenchConfig(
                task=task,
                precision=prec,
                model=a.model,
                device=a.device,
                seed=a.seed,
                threads=a.threads,
                max_completion_tokens=64 if task == "single" else 128,
            )
            results.append(
                compare(
                    cfg,
                    rounds=a.rounds,
                    steps=a.steps,
                    malloc_tuned=not a.no_malloc_tuning,
                    timeout_s=a.child_timeout,
                )
            )
    rows = []
    for r in results:
        c = r["config"]
        for side in ("trl", "flowgrpo"):
            s = r[side]
            rows.append(
                [
                    f"{c['task']}/{c['precision']}",
                    side,
                    s["median_step_s"],
                    s["steps_per_s"],
                    s["completion_tok_per_s"],
                    s["peak_rss_gb"],
                    s["n_steps"],
                ]
            )
        rows.append(
            [
                f"{c['task']}/{c['precision']}",
                "**ratio ours/TRL**",
                "",
                r["speedup_steps_per_s"],
                r["speedup_tok_per_s"],
                r["rss_ratio"],
                "",
            ]
        )
    print()
    print(
        fmt_table(
            rows,
            [
                "task/precision",
                "side",
                "median s/step",
                "steps/s",
                "completion tok/s",
                "peak RSS GB",
                "timed steps",
            ],
        )
    )
    print("\nours, median phase seconds:")
    for r in results:
        ph = r["phases"]
        if ph:
            print(
                f"  {r['config']['task']}/{r['config']['precision']}: "
                + ", ".join(f"{k} {median([p[k] for p in ph]):.2f}" for k in ph[0])
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": info, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
