"""Replay: read a run directory back and look at what the policy actually did.

Three questions come up when a training curve looks wrong, and each has a tool here:

- *What happened?* :func:`format_trajectory` prints an episode turn by turn -- the messages, the
  tool calls and what came back, per-turn reward and advantage, how many prompt and action tokens
  each turn fed and sampled, why the episode ended and how the reward broke down. It reads only
  the stored :class:`~flowgrpo.types.Trajectory`, so it works on any run, even one whose
  environment no longer exists.
- *Was it scored right?* :func:`rescore` scores saved trajectories with other rewards
  (:class:`flowgrpo.rewards.CompositeReward`, offline) and tabulates old against new, e.g. to
  check whether a format bonus is what the policy learnt to farm.
- *Is the environment deterministic?* :func:`reexecute` runs each recorded action's tool calls
  against a fresh environment and reports every observation that differs from the recorded one.
  For deterministic tools (calculator, BM25 search) any difference is a bug: a tool that depends
  on hidden state, or an environment whose episodes leak into each other -- exactly the kind of
  silent non-stationarity that makes RL curves hard to read.

The run directory is read through :class:`flowgrpo.runs.rundir.RunDir` (trajectories are parsed on
first access to a step).

The command line is ``flowgrpo replay RUN [--step N] [--task ID] [--traj K] [--rescore ...]
[--reexecute]`` (:mod:`flowgrpo.cli`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowgrpo.chat.parsing import ParseError
from flowgrpo.rollout.agentflow.render import flow_text
from flowgrpo.runs.rundir import RunDir, RunError
from flowgrpo.types import Message, ParsedAction, Task, Termination, Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# What replay needs from a run besides its trajectories: its tokenizer and its environment
# ---------------------------------------------------------------------------------------------


def load_tokenizer_for_run(run: RunDir) -> Any | None:
    """The run's tokenizer, or None (with a logged reason) when it cannot be had offline.

    Names resolve as :func:`flowgrpo.modeling.models.load_model` resolves them (``tiny`` is the tests'
    tokenizer); only the tokenizer is loaded.
    """
    try:
        name = run.config().model.name
    except RunError as e:
        log.warning("%s: showing token ids", e)
        return None
    try:
        from flowgrpo.modeling.models import load_tokenizer

        return load_tokenizer(name)
    except Exception as e:
        log.warning("cannot load the tokenizer of %r (%s): showing token ids", name, e)
        return None


def make_run_env_factory(
    run: RunDir, env_name: str | None = None, env_kwargs: Mapping[str, Any] | None = None
) -> Callable[[], Any]:
    """A factory of fresh environments as the run configured them (or as overridden)."""
    from flowgrpo.components import env_factory_of
    from flowgrpo.config import EnvConfig

    if env_name is None:
        try:
            env = run.config().env
        except RunError as e:
            raise RunError(f"{e}\n(or name the environment: --env NAME [--env-kwargs JSON])") from None
    else:
        env = EnvConfig(name=env_name)
    if env_kwargs is not None:
        env = EnvConfig(name=env.name, kwargs=dict(env_kwargs))
    return env_factory_of(env)


def tasks_by_id(env: Any) -> dict[str, Task]:
    """Every task of an environment, both splits, by id."""
    out: dict[str, Task] = {}
    for split in ("train", "test"):
        for t in env.tasks(split):
            out.setdefault(t.id, t)
    return out


def select_trajectories(
    run: RunDir, *, step: int | None = None, task: str | None = None, traj: str | int | None = None
) -> tuple[int, list[Trajectory]]:
    """The trajectories of ``step`` (default: the last saved step), filtered by task id, then the
    ``traj``-th of them (an index) or the one with that trajectory id. Returns ``(step, trajs)``."""
    steps = run.steps()
    if not steps:
        raise RunError(f"{run.path / 'trajectories'} holds no step_*.jsonl files: nothing to replay")
    if step is None:
        step = steps[-1]
    trajs = run.trajectories(step)
    if task is not None:
        trajs = [t for t in trajs if t.task_id == task]
        if not trajs:
            ids = sorted({t.task_id for t in run.trajectories(step)})
            raise RunError(
                f"step {step} has no trajectory of task {task!r}; its tasks: {', '.join(ids[:20])}"
            )
    if traj is not None:
        if isinstance(traj, str) and not traj.lstrip("-").isdigit():
            found = [t for t in trajs if t.id == traj]
            if not found:
                raise RunError(f"no trajectory with id {traj!r} at step {step}")
            trajs = found
        else:
            k = int(traj)
            if not -len(trajs) <= k < len(trajs):
                raise RunError(f"--traj {k} is out of range: the selection holds {len(trajs)} trajectories")
            trajs = [trajs[k]]
    return step, trajs


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


class Style:
    """ANSI styles; all empty when colour is off, so the text is identical minus escapes."""

    def __init__(self, color: bool) -> None:
        def c(code: str) -> str:
            return f"\x1b[{code}m" if color else ""

        self.reset = c("0")
        self.bold = c("1")
        self.dim = c("2")
        self.red = c("31")
        self.green = c("32")
        self.yellow = c("33")
        self.blue = c("34")
        self.magenta = c("35")
        self.cyan = c("36")

    def signed(self, x: float | None, fmt: str = "+.3f") -> str:
        if x is None:
            return f"{self.dim}n/a{self.reset}"
        col = self.green if x > 0 else self.red if x < 0 else ""
        return f"{col}{x:{fmt}}{self.reset}" if col else f"{x:{fmt}}"


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + ln for ln in (text.splitlines() or [""]))


def _message_block(m: Message, st: Style) -> str:
    if m.role == "tool":
        head = f"{st.yellow}[tool{' ' + m.name if m.name else ''}]{st.reset}"
        if m.tool_call_id:
            head += f" {st.dim}(answers {m.tool_call_id}){st.reset}"
    elif m.role == "user":
        head = f"{st.magenta}[user]{st.reset}"
    elif m.role == "assistant":
        head = f"{st.cyan}{st.bold}[assistant{' ' + m.name if m.name else ''}]{st.reset}"
    else:
        head = f"{st.blue}[{m.role}]{st.reset}"
    lines = [head, _indent(m.content)]
    for call in m.tool_calls:
        args = json.dumps(call.arguments, ensure_ascii=False)
        lines.append(f"    {st.green}-> call {call.name}({args}){st.reset} {st.dim}id={call.id}{st.reset}")
    return "\n".join(lines)


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def format_trajectory(
    traj: Trajectory,
    tokenizer: Any | None = None,
    *,
    task: Task | None = None,
    color: bool = False,
    title: str | None = None,
) -> str:
    """A trajectory as readable text, turn by turn.

    The opening prompt is stored only as token ids (``turns[0].prompt_ids``), so it is shown
    decoded when a ``tokenizer`` is given, else the ``task``'s prompt when given, else as a token
    count. Actions and observations are stored as messages and always shown.
    """
    st = Style(color)
    out: list[str] = []
    prompt_tok = sum(len(t.prompt_ids) for t in traj.turns)
    action_tok = traj.num_action_tokens
    head = title or f"trajectory {traj.id}"
    out.append(f"{st.bold}== {head} =={st.reset}")
    out.append(
        f"task {traj.task_id or '?'}  env {traj.env or '?'}  group {traj.group_id or '?'}  "
        f"policy v{traj.policy_version}"
    )
    breakdown = "  ".join(f"{k}={v:.3f}" for k, v in sorted(traj.reward_breakdown.items()))
    out.append(
        f"reward {st.signed(traj.reward, '.3f')}"
        + (f"  ({breakdown})" if breakdown else "")
        + f"  termination {_termination_text(traj, st)}  turns {len(traj.turns)}"
    )
    out.append(f"tokens {traj.num_tokens} (prompt/observation {prompt_tok}, action {action_tok})")
    if task is not None and task.answer is not None:
        out.append(f"gold answer: {task.answer}")
    if traj.metadata.get("error"):
        out.append(f"{st.red}error: {traj.metadata['error']}{st.reset}")
    for k, turn in enumerate(traj.turns):
        adv = turn.advantage
        out.append(
            f"{st.bold}-- turn {k + 1}/{len(traj.turns)}{st.reset}  prompt {len(turn.prompt_ids)} tok  "
            f"action {len(turn.action_ids)} tok  reward {turn.reward:+.3f}  advantage {st.signed(adv)}  "
            f"finish {turn.finish_reason}" + ("  (context reset)" if turn.resets_context else "")
        )
        if k == 0 or turn.resets_context:
            if tokenizer is not None:
                out.append(f"{st.dim}[prompt, as the model saw it]{st.reset}")
                out.append(f"{st.dim}{_indent(_decode(tokenizer, turn.prompt_ids))}{st.reset}")
            elif task is not None:
                out.append(f"{st.magenta}[task prompt]{st.reset}")
                out.append(_indent(task.prompt))
            else:
                out.append(
                    f"{st.dim}[prompt: {len(turn.prompt_ids)} tokens; pass a tokenizer to see them]{st.reset}"
                )
        out.append(_message_block(turn.action, st))
        if turn.observations:
            for m in turn.observations:
                out.append(_message_block(m, st))
        if isinstance(turn.metadata.get("flow"), Mapping):
            out.append(flow_text(turn.metadata["flow"]))
        info = turn.metadata.get("info")
        if isinstance(info, Mapping) and "answer" in info:
            out.append(
                f"    {st.bold}final answer: {info['answer']!s}{st.reset}  correct: {info.get('correct')}"
            )
    if isinstance(traj.metadata.get("flow"), Mapping):
        out.append(f"{st.bold}-- end of the flow{st.reset}")
        out.append(flow_text(traj.metadata["flow"]))
    return "\n".join(out)


def _termination_text(traj: Trajectory, st: Style) -> str:
    term = traj.termination.value if isinstance(traj.termination, Termination) else str(traj.termination)
    col = st.green if term == "finished" else st.yellow if term in ("max_turns", "max_tokens") else st.red
    return f"{col}{term}{st.reset}"


def format_summary(trajs: Sequence[Trajectory], *, step: int | None = None, color: bool = False) -> str:
    """One line per trajectory: index, task, reward, advantage of the first turn, turns, tokens."""
    st = Style(color)
    rows = [
        f"{'#':>3}  {'task':<28} {'reward':>7} {'adv':>7} {'turns':>5} {'tokens':>7}  termination",
    ]
    for i, t in enumerate(trajs):
        adv = next((u.advantage for u in t.turns if u.advantage is not None), None)
        adv_s = f"{adv:+7.3f}" if adv is not None else f"{'n/a':>7}"
        rows.append(
            f"{i:>3}  {t.task_id[:28]:<28} {t.reward:>7.3f} {adv_s} {len(t.turns):>5} {t.num_tokens:>7}  "
            f"{_termination_text(t, st)}"
        )
    if trajs:
        mean = sum(t.reward for t in trajs) / len(trajs)
        rows.append(
            f"{len(trajs)} trajectories"
            + (f" at step {step}" if step is not None else "")
            + f", mean reward {mean:.3f}"
        )
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# Rescoring
# ---------------------------------------------------------------------------------------------


def parse_reward_args(args: Sequence[str]) -> list[Any]:
    """``["accuracy", "format=0.2"]`` -> RewardSpecs (``NAME`` or ``NAME=WEIGHT``)."""
    from flowgrpo.rewards import RewardSpec

    specs = []
    for a in args:
        name, _, weight = a.partition("=")
        if not name:
            raise ValueError(f"bad reward {a!r}: write NAME or NAME=WEIGHT, e.g. accuracy format=0.2")
        try:
            w = float(weight) if weight else 1.0
        except ValueError as e:
            raise ValueError(f"bad weight in {a!r}: {weight!r} is not a number") from e
        specs.append(RewardSpec(name=name, weight=w))
    return specs


@dataclass
class RescoreRow:
    traj_id: str
    task_id: str
    old_reward: float
    new_reward: float
    old_breakdown: dict[str, float]
    new_breakdown: dict[str, float]


@dataclass
class RescoreReport:
    rows: list[RescoreRow]
    reward_names: list[str]

    @property
    def old_mean(self) -> float:
        return sum(r.old_reward for r in self.rows) / len(self.rows) if self.rows else 0.0

    @property
    def new_mean(self) -> float:
        return sum(r.new_reward for r in self.rows) / len(self.rows) if self.rows else 0.0

    def part_mean(self, name: str) -> float:
        return sum(r.new_breakdown[name] for r in self.rows) / len(self.rows) if self.rows else 0.0

    def format(self) -> str:
        names = self.reward_names
        head = f"{'trajectory':<18} {'task':<28} {'old':>7} {'new':>7} {'delta':>7}" + "".join(
            f" {n[:10]:>10}" for n in names
        )
        lines = [head]
        for r in self.rows:
            lines.append(
                f"{r.traj_id[:18]:<18} {r.task_id[:28]:<28} {r.old_reward:>7.3f} {r.new_reward:>7.3f} "
                f"{r.new_reward - r.old_reward:>+7.3f}"
                + "".join(f" {r.new_breakdown[n]:>10.3f}" for n in names)
            )
        lines.append(
            f"{'mean':<18} {'(' + str(len(self.rows)) + ' trajectories)':<28} {self.old_mean:>7.3f} "
            f"{self.new_mean:>7.3f} {self.new_mean - self.old_mean:>+7.3f}"
            + "".join(f" {self.part_mean(n):>10.3f}" for n in names)
        )
        return "\n".join(lines)


def rescore(
    trajs: Sequence[Trajectory], rewards: Sequence[Any], tasks: Mapping[str, Task], *, fns: Any = None
) -> RescoreReport:
    """Score copies of ``trajs`` with ``rewards`` (RewardSpecs, dicts or names); the originals are
    untouched. Trajectories are grouped by ``group_id`` so group rewards (diversity) see their group."""
    from flowgrpo.rewards import CompositeReward, RewardSpec

    specs = [RewardSpec(name=r) if isinstance(r, str) else r for r in rewards]
    composite = CompositeReward(specs, fns=fns)
    missing = sorted({t.task_id for t in trajs if t.task_id not in tasks})
    if missing:
        raise RunError(
            f"{len(missing)} task ids are not among the environment's tasks (first: {missing[:5]}); was the "
            "run made with other env kwargs? pass --env NAME --env-kwargs JSON"
        )
    copies = [t.model_copy(deep=True) for t in trajs]
    for c in copies:
        c.reward_breakdown = {}
    groups: dict[str, TrajectoryGroup] = {}
    for c in copies:
        key = c.group_id or c.id
        if key not in groups:
            groups[key] = TrajectoryGroup(group_id=key, task=tasks[c.task_id])
        groups[key].trajectories.append(c)
    composite.score_groups(list(groups.values()))
    rows = [
        RescoreRow(o.id, o.task_id, o.reward, c.reward, dict(o.reward_breakdown), dict(c.reward_breakdown))
        for o, c in zip(trajs, copies, strict=True)
    ]
    return RescoreReport(rows=rows, reward_names=[s.name for s in composite.specs])


# ---------------------------------------------------------------------------------------------
# Re-execution
# ---------------------------------------------------------------------------------------------


@dataclass
class ObservationDiff:
    """One place where re-execution disagrees with the record."""

    traj_id: str
    task_id: str
    turn: int  # 0-based
    index: int  # observation index in the turn; -1 for a turn-level difference
    recorded: Message | None
    replayed: Message | None
    note: str = ""

    def format(self, color: bool = False) -> str:
        st = Style(color)
        where = f"{self.traj_id} (task {self.task_id}) turn {self.turn + 1}"
        if self.index >= 0:
            where += f" observation {self.index + 1}"
        lines = [f"{st.bold}{where}{st.reset}" + (f": {self.note}" if self.note else "")]
        for label, m, col in (("recorded", self.recorded, st.red), ("replayed", self.replayed, st.green)):
            if m is not None or self.index >= 0:
                text = "(none)" if m is None else f"[{m.role}{' ' + m.name if m.name else ''}] {m.content}"
                lines.append(f"  {col}{label}:{st.reset} " + text.replace("\n", "\n            "))
        return "\n".join(lines)


@dataclass
class ReexecuteReport:
    diffs: list[ObservationDiff] = field(default_factory=list)
    identical: int = 0  # observations that matched exactly
    compared: int = 0  # observations compared (recorded or replayed)
    trajectories: int = 0
    skipped: list[str] = field(default_factory=list)  # why a trajectory could not be replayed

    @property
    def ok(self) -> bool:
        return not self.diffs and not self.skipped

    def format(self, color: bool = False) -> str:
        lines = [d.format(color) for d in self.diffs]
        lines += [f"skipped: {s}" for s in self.skipped]
        lines.append(
            f"{self.trajectories} trajectories re-executed: {self.identical}/{self.compared} observations "
            f"identical, {len(self.diffs)} differences"
            + (f", {len(self.skipped)} skipped" if self.skipped else "")
        )
        return "\n".join(lines)


def _same(a: Message, b: Message) -> bool:
    return a.model_dump() == b.model_dump()


def _parsed_action(env: Any, turn_action: Message) -> tuple[ParsedAction, str]:
    """Rebuild the ParsedAction the rollout gave ``env.step``: the recorded message (its tool-call
    ids included, so ``tool_call_id`` matches) plus the answer and errors the parser reads from its
    text. Returns a note when the parser now reads different tool calls than were recorded."""
    try:
        parsed = env.parser.parse(turn_action.content)
    except ParseError as e:
        return ParsedAction(message=turn_action, errors=[str(e)]), ""
    note = ""
    now = [(c.name, c.arguments) for c in parsed.message.tool_calls]
    then = [(c.name, c.arguments) for c in turn_action.tool_calls]
    if now != then:
        note = f"the parser now reads the action's tool calls as {now}, the record has {then}"
    return ParsedAction(message=turn_action, answer=parsed.answer, errors=list(parsed.errors)), note


async def areexecute(
    trajs: Sequence[Trajectory], env_factory: Callable[[], Any], tasks: Mapping[str, Task] | None = None
) -> ReexecuteReport:
    """Replay every trajectory's actions against a fresh environment and compare observations.

    Each trajectory gets its own environment (as the rollout does), reset on its task; each
    recorded turn's action is stepped in order. A turn cut by the token limit was never stepped and
    ends the replay of that trajectory. Differences in observations, in termination (the env ends
    the episode earlier or later than the record) and exceptions are all reported.
    """
    report = ReexecuteReport()
    if tasks is None:
        tasks = tasks_by_id(env_factory())
    for traj in trajs:
        task = tasks.get(traj.task_id)
        if task is None:
            report.skipped.append(f"{traj.id}: task {traj.task_id!r} is not among the environment's tasks")
            continue
        report.trajectories += 1
        env = env_factory()
        await env.reset(task)

        def episode_diff(k: int, note: str, traj: Trajectory = traj) -> None:
            """A difference about the episode at turn ``k``, not about one observation."""
            report.diffs.append(ObservationDiff(traj.id, traj.task_id, k, -1, None, None, note))

        for k, turn in enumerate(traj.turns):
            if turn.finish_reason == "length":
                break  # the rollout never stepped a truncated action
            action, note = _parsed_action(env, turn.action)
            if note:
                episode_diff(k, note)
            try:
                res = await env.step(action)
            except Exception as e:
                episode_diff(k, f"env.step raised {type(e).__name__}: {e}")
                break
            rec, new = list(turn.observations), list(res.observations)
            for i in range(max(len(rec), len(new))):
                a = rec[i] if i < len(rec) else None
                b = new[i] if i < len(new) else None
                report.compared += 1
                if a is not None and b is not None and _same(a, b):
                    report.identical += 1
                else:
                    report.diffs.append(ObservationDiff(traj.id, traj.task_id, k, i, a, b))
            last = k == len(traj.turns) - 1
            ended = res.terminated or res.truncated
            if ended and not last:
                episode_diff(
                    k,
                    f"the environment ended the episode here but the record has {len(traj.turns) - k - 1} more turns",
                )
                break
            if last and traj.termination == Termination.finished and not res.terminated:
                episode_diff(
                    k, "the record ends with termination 'finished' but the environment did not terminate"
                )
    return report


def reexecute(
    trajs: Sequence[Trajectory], env_factory: Callable[[], Any], tasks: Mapping[str, Task] | None = None
) -> ReexecuteReport:
    """Blocking :func:`areexecute` (must not be called inside a running event loop)."""
    return asyncio.run(areexecute(trajs, env_factory, tasks))


# ---------------------------------------------------------------------------------------------
# Command line (``flowgrpo replay``; the parser is in flowgrpo.cli)
# ---------------------------------------------------------------------------------------------


def _use_color(mode: str) -> bool:
    if mode == "always":
        return True
    if mode == "never":
        return False
    return sys.stdout.isatty() and os.environ.get("NO_COLOR") is None and os.environ.get("TERM") != "dumb"


def cli_replay(args: Any) -> int:
    """``flowgrpo replay``: returns the exit code (2 for a bad run or selection, 1 when
    ``--reexecute`` found differences)."""
    try:
        return _cli_replay(args)
    except (RunError, KeyError, ValueError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"flowgrpo replay: error: {msg}", file=sys.stderr)
        return 2


def _cli_replay(args: Any) -> int:
    run = RunDir(args.run)
    color = _use_color(args.color)
    step, trajs = select_trajectories(run, step=args.step, task=args.task, traj=args.traj)
    needs_env = bool(args.rescore or args.reexecute)
    factory = tasks = None
    if needs_env or args.env:
        factory = make_run_env_factory(run, args.env, args.env_kwargs)
        tasks = tasks_by_id(factory())
    if args.rescore:
        report = rescore(trajs, parse_reward_args(args.rescore), tasks or {})
        print(f"step {step}: rescoring {len(trajs)} trajectories with {' '.join(args.rescore)}")
        print(report.format())
        return 0
    if args.reexecute:
        rep = reexecute(trajs, factory, tasks)  # type: ignore[arg-type]
        print(f"step {step}: re-executing {len(trajs)} trajectories")
        print(rep.format(color))
        return 0 if rep.ok else 1
    tokenizer = None if args.no_tokenizer else load_tokenizer_for_run(run)
    if len(trajs) > 1:
        print(format_summary(trajs, step=step, color=color))
        print()
    shown = trajs[: max(args.limit, 0)] if len(trajs) > 1 else trajs
    for i, t in enumerate(shown):
        title = f"step {step}, trajectory {t.id}" + (f" (#{i})" if len(trajs) > 1 else "")
        task = tasks.get(t.task_id) if tasks else None
        print(format_trajectory(t, tokenizer, task=task, color=color, title=title))
        print()
    if len(shown) < len(trajs):
        print(f"({len(trajs) - len(shown)} more; select one with --traj K or --task ID, or raise --limit)")
    return 0


__all__ = [
    "ObservationDiff",
    "ReexecuteReport",
    "RescoreReport",
    "RescoreRow",
    "areexecute",
    "cli_replay",
    "format_summary",
    "format_trajectory",
    "load_tokenizer_for_run",
    "make_run_env_factory",
    "parse_reward_args",
    "reexecute",
    "rescore",
    "select_trajectories",
    "tasks_by_id",
]
