"""Failure taxonomy of saved arithmetic episodes: why each wrong held-out episode is wrong.

    python -m benchmarks.failures runs/calculator_agent warm step40      # labels under RUN/eval/
    python -m benchmarks.failures runs/arms/lr5e-5 warm step36 --markdown

Reads ``RUN/eval/LABEL.jsonl`` (written by every recorded evaluation) and puts each episode in
exactly one class, first match wins:

- ``correct``
- ``truncated``: the episode hit the token, turn or context limit without an answer
- ``format``: no parsable answer tag in the last action (a tool call that did not parse counts here)
- ``no_calculator``: answered without a successful calculator result
- ``calculator_error``: the last calculator call returned an error
- ``right_value_wrong_answer``: some calculator result equals the gold answer, the final answer does not
- ``order_of_operations``: the oracle's numbers, and a left-to-right reading gives the gold answer
  but precedence does not (missing parentheses)
- ``wrong_operator``: the oracle's numbers, combined with other operators ("gives 37 away" as ``+ 37``)
- ``extra_operation``: more numbers than the oracle's expression (an invented ``* 3``, ``- 1``)
- ``missing_operation``: fewer numbers than the oracle's expression (a step of the story dropped)
- ``wrong_numbers``: as many numbers as the oracle's, but not the same ones (a number miscopied)
- ``lost_track``: several calculator calls whose last result is wrong (the chain broke across turns)

Prints one column per label (counts and shares of all episodes), so the table shows which failures
RL removed between the warm start and the trained checkpoint.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

from flowgrpo.algorithms.episodes import accuracy_of
from flowgrpo.rewards import final_answer, math_equal
from flowgrpo.runs.rundir import RunDir, RunError
from flowgrpo.types import Termination, Trajectory

CLASSES = (
    "correct",
    "truncated",
    "format",
    "no_calculator",
    "calculator_error",
    "right_value_wrong_answer",
    "order_of_operations",
    "wrong_operator",
    "extra_operation",
    "missing_operation",
    "wrong_numbers",
    "lost_track",
)

_NUM = re.compile(r"\d+")


def left_to_right(expression: str) -> int | None:
    """The value of ``expression`` read strictly left to right, ignoring precedence and parentheses
    (``63 * 4 - 24 / 4`` -> ``((63 * 4) - 24) / 4``); None if it is not a flat chain of + - * /."""
    toks = re.findall(r"\d+|[-+*/]", expression.replace("(", " ").replace(")", " "))
    if not toks or not toks[0].isdigit():
        return None
    value = float(toks[0])
    for op, num in zip(toks[1::2], toks[2::2], strict=False):
        if not num.isdigit():
            return None
        b = float(num)
        value = {"+": value + b, "-": value - b, "*": value * b, "/": value / b if b else float("nan")}[op]
    return round(value) if value == value and abs(value - round(value)) < 1e-9 else None


def classify(traj: Trajectory, gold: str, oracle_expression: str) -> str:
    """The failure class of one episode (see the module docstring)."""
    if accuracy_of(traj) >= 1.0:
        return "correct"
    calls = [(c.arguments.get("expression", ""), obs.content)
             for turn in traj.turns for c, obs in zip(
                 [c for c in turn.action.tool_calls if c.name == "calculator"],
                 [o for o in turn.observations if o.name == "calculator"], strict=False)]  # fmt: skip
    answer = final_answer(traj)
    if answer is None:
        if traj.termination in (Termination.max_tokens, Termination.max_turns, Termination.context_overflow):
            return "truncated"
        return "format"
    ok = [(e, out) for e, out in calls if not out.lower().startswith("error")]
    if not ok:
        return "calculator_error" if calls else "no_calculator"
    if calls[-1][1].lower().startswith("error"):
        return "calculator_error"
    if any(math_equal(out.strip(), gold) for _, out in ok):
        return "right_value_wrong_answer"
    if len(calls) > 1:
        return "lost_track"
    expr = ok[-1][0]
    mine, want = sorted(_NUM.findall(expr)), sorted(_NUM.findall(oracle_expression))
    if len(mine) > len(want):
        return "extra_operation"
    if len(mine) < len(want):
        return "missing_operation"
    if mine != want:
        return "wrong_numbers"
    l2r = left_to_right(expr)
    return "order_of_operations" if l2r is not None and str(l2r) == gold else "wrong_operator"


def taxonomy(run: RunDir, label: str, tasks: dict[str, tuple[str, str]]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for traj in run.eval_episodes(label):
        gold, expression = tasks[traj.task_id]
        counts[classify(traj, gold, expression)] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("labels", nargs="+", help="evaluation labels, e.g. warm step40")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    from flowgrpo.components import env_factory_of

    try:
        run = RunDir(args.run)
        cfg = run.config()
        env = env_factory_of(cfg.env)()
        tasks = {
            t.id: (t.answer or "", str(t.metadata.get("expression", "")))
            for split in ("train", "test")
            for t in env.tasks(split)
        }
        cols = {label: taxonomy(run, label, tasks) for label in args.labels}
    except RunError as e:
        raise SystemExit(f"error: {e}") from None
    totals = {label: sum(c.values()) for label, c in cols.items()}
    if args.markdown:
        print("| class | " + " | ".join(f"{lab} (n={totals[lab]})" for lab in cols) + " |")
        print("|---|" + "---|" * len(cols))
    for cls in CLASSES:
        cells = [f"{c[cls]} ({100 * c[cls] / max(totals[lab], 1):.1f}%)" for lab, c in cols.items()]
        if args.markdown:
            print(f"| {cls} | " + " | ".join(cells) + " |")
        else:
            print(f"{cls:<26}" + "".join(f"{x:>18}" for x in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
