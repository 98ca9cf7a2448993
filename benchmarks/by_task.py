"""Held-out accuracy of recorded evaluations, or of the sampled training batches, split by a field
of the tasks' metadata.

    python -m benchmarks.by_task runs/arms/multihop-recipe warm step2 step3 --key hops
    python -m benchmarks.by_task runs/calculator_agent warm step3 --key difficulty
    python -m benchmarks.by_task runs/search_agent --steps 1 2 3 --key hops
    python -m benchmarks.by_task runs/search_agent --steps 1 2 3 --key hops --decision 2
    python -m benchmarks.by_task runs/search_agent warm step3 --key chain
    python -m benchmarks.by_task runs/search_agent warm step3 --key hops --paired

Reads ``RUN/eval/LABEL.jsonl`` (written by every recorded evaluation), looks each episode's task up
in the run's environment, and prints, per value of ``task.metadata[KEY]`` and per label, the number
of correct episodes, n and the Wilson 95% interval, and the mean number of turns. It answers "which
kind of task did RL fix or break" where one accuracy hides it (e.g. 1-hop against 2-hop questions).
``--paired`` adds, per value, the difference from the first label to the last on the tasks both
evaluated (Newcombe 95% interval, exact McNemar p, tasks fixed and broken, and the 2x2 counts that
``benchmarks.pool_tables`` pools): a paired test on one kind of task, such as the 2-hop questions
alone. Name that kind before reading the table; a kind picked after it makes the
p-value mean little. With ``--steps`` it reads the trajectories each training step sampled
(``RUN/trajectories``) instead, and each cell also counts the tasks (groups) of that kind in the
step's batch: what each update was pushed toward. ``--decision N`` adds a table of the N-th turn
of those episodes: how many called a tool there and how many did not (answered, or wrote no call),
each with its mean advantage, and the push (the sum of the calls' advantages). It shows which way,
and how hard, each step's update pushed that decision for each kind of task, e.g. whether 1-hop
questions' groups rewarded stopping after one search while 2-hop ones rewarded searching again.
"""

from __future__ import annotations

import argparse

from flowgrpo.algorithms.curriculum import stratum_of
from flowgrpo.algorithms.episodes import accuracy_of
from flowgrpo.algorithms.stats import paired_difference, wilson_interval
from flowgrpo.runs.rundir import RunDir, RunError
from flowgrpo.types import Trajectory


def decision_cell(trajs: list[Trajectory], turn: int) -> str:
    """Turn ``turn`` (0-based) of the episodes that reached it with an advantage: how many called a
    tool and how many did not, each with its mean advantage, and the push: the sum of the tool
    calls' advantages. For a choice between calling and not at one context, the policy gradient
    on the log-odds of calling is ``sum_i A_i (1[i called] - p)``, which is that sum wherever the
    advantages of the episodes at the decision sum to zero, as a group's do (docs/learning.md
    10.4). Negative: the update pulls toward not calling."""
    calls: list[float] = []
    other: list[float] = []
    for t in trajs:
        if len(t.turns) > turn and (a := t.turns[turn].advantage) is not None:
            (calls if t.turns[turn].action.tool_calls else other).append(a)

    def part(xs: list[float]) -> str:
        return f"{len(xs)} ({sum(xs) / len(xs):+.2f})" if xs else "0"

    return f"{part(calls)} / {part(other)}, push {sum(calls):+.2f}"


def paired_cell(first: list[Trajectory], last: list[Trajectory]) -> str:
    """The last evaluation against the first on the tasks both hold (one greedy episode per task):
    difference in points [Newcombe 95% CI], exact McNemar p, the tasks fixed and broken, and the
    2x2 counts (both right, only first, only last, neither) that ``benchmarks.pool_tables --arm``
    takes to pool this comparison with others."""
    a = {t.task_id: accuracy_of(t) >= 1.0 for t in first}
    b = {t.task_id: accuracy_of(t) >= 1.0 for t in last}
    shared = [k for k in a if k in b]
    if not shared:
        return "no shared tasks"
    c = paired_difference([a[k] for k in shared], [b[k] for k in shared])
    lo, hi = c.ci95
    return (
        f"{100 * c.difference:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}], p = {c.p_value:.2g} "
        f"(n = {c.n}; {c.only_b} fixed, {c.only_a} broken; 2x2 {c.counts})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("labels", nargs="*", help="evaluation labels, e.g. warm step3")
    ap.add_argument("--steps", type=int, nargs="+", help="training steps whose sampled batches to split")
    ap.add_argument("--key", required=True, help="a task metadata field, e.g. hops")
    ap.add_argument(
        "--decision",
        type=int,
        metavar="N",
        help="with --steps: also split the N-th turn (1-based) into tool calls and the rest, with mean advantages",
    )
    ap.add_argument(
        "--paired",
        action="store_true",
        help="with two or more evaluation labels: per value, the last label against the first, paired",
    )
    args = ap.parse_args(argv)
    if bool(args.labels) == bool(args.steps):
        ap.error("give evaluation labels (e.g. warm step3) or --steps N ..., not both and not neither")
    if args.decision is not None and (not args.steps or args.decision < 1):
        ap.error("--decision N needs --steps (sampled episodes carry advantages) and N >= 1")
    if args.paired and len(args.labels) < 2:
        ap.error("--paired compares evaluations: give two or more labels, e.g. warm step3")
    from flowgrpo.components import env_factory_of

    try:
        run = RunDir(args.run)
        env = env_factory_of(run.config().env)()
        value = {
            t.id: stratum_of(t.metadata.get(args.key))
            for split in ("train", "test")
            for t in env.tasks(split)
        }
        if args.steps:
            episodes = {f"step {k} (sampled)": run.trajectories(k) for k in args.steps}
        else:
            episodes = {label: run.eval_episodes(label) for label in args.labels}
    except RunError as e:
        raise SystemExit(f"error: {e}") from None
    print(
        f"| {args.key} | "
        + " | ".join(
            f"{label}: correct / n [95% CI], turns{' (tasks)' * bool(args.steps)}" for label in episodes
        )
        + (f" | {args.labels[-1]} - {args.labels[0]}, paired [95% CI], p" if args.paired else "")
        + " |"
    )
    print("|---|" + "---|" * (len(episodes) + args.paired))
    keys = sorted({value.get(t.task_id) for trajs in episodes.values() for t in trajs}, key=str)
    split = {
        k: [[t for t in trajs if value.get(t.task_id) == k] for trajs in episodes.values()] for k in keys
    }
    for k, per_label in split.items():
        cells = []
        for mine in per_label:
            n, c = len(mine), sum(accuracy_of(t) >= 1.0 for t in mine)
            turns = [len(t.turns) for t in mine]
            lo, hi = wilson_interval(c, n) if n else (0.0, 0.0)
            n_tasks = len({t.task_id for t in mine})
            tasks = f" ({n_tasks} task{'s' * (n_tasks != 1)})" if args.steps else ""
            cells.append(f"{c} / {n} [{lo:.3f}, {hi:.3f}], {sum(turns) / max(n, 1):.2f}{tasks}")
        if args.paired:
            cells.append(paired_cell(per_label[0], per_label[-1]))
        print(f"| {k} | " + " | ".join(cells) + " |")
    if args.decision:
        turn = args.decision
        print(
            f"\nturn {turn} of the sampled episodes that reached it: tool calls (mean advantage) / other "
            "actions, push (sum of the tool calls' advantages)\n"
        )
        print(f"| {args.key} | " + " | ".join(f"{label}, turn {turn}" for label in episodes) + " |")
        print("|---|" + "---|" * len(episodes))
        for k, per_label in split.items():
            print(f"| {k} | " + " | ".join(decision_cell(mine, turn - 1) for mine in per_label) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
