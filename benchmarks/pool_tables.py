"""Paired comparisons rebuilt from 2x2 tables, per arm and pooled across arms.

    python -m benchmarks.pool_tables --arm seed0=184,3,3,1 --arm seed1=155,1,35,0 --arm seed2=181,0,8,2

Each ``--arm NAME=BOTH,ONLY_A,ONLY_B,NEITHER`` is one arm's counts of tasks on which checkpoints A and
B were both right, only A right, only B right, or both wrong. It is how an arm whose run directory is
gone (its per-task files went with its machine) joins a pooled test: the exact McNemar p and the
Newcombe interval depend on these four counts alone, so the table rebuilt from them gives the same
figures as the run's own files. The pooled row concatenates the arms' pairs, as
``benchmarks.learning_matrix`` does for arms it can read.
"""

from __future__ import annotations

import argparse

from flowgrpo.algorithms.stats import PairedComparison, paired_difference


def outcomes(both: int, only_a: int, only_b: int, neither: int) -> tuple[list[int], list[int]]:
    """Per-task outcomes (1 = right) of A and B that have this 2x2 table."""
    if min(both, only_a, only_b, neither) < 0:
        raise ValueError(f"2x2 counts must be >= 0, got {both},{only_a},{only_b},{neither}")
    a = [1] * both + [1] * only_a + [0] * only_b + [0] * neither
    b = [1] * both + [0] * only_a + [1] * only_b + [0] * neither
    return a, b


def parse_arm(text: str) -> tuple[str, tuple[int, int, int, int]]:
    """``NAME=BOTH,ONLY_A,ONLY_B,NEITHER`` -> (name, counts)."""
    name, sep, counts = text.partition("=")
    parts = counts.split(",")
    if not sep or not name or len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"--arm {text!r}: expected NAME=BOTH,ONLY_A,ONLY_B,NEITHER with four counts >= 0, e.g. seed0=184,3,3,1"
        )
    both, only_a, only_b, neither = (int(p) for p in parts)
    return name, (both, only_a, only_b, neither)


def pooled(arms: list[tuple[int, int, int, int]]) -> PairedComparison:
    """The paired comparison of every arm's pairs concatenated."""
    a: list[int] = []
    b: list[int] = []
    for counts in arms:
        xa, xb = outcomes(*counts)
        a += xa
        b += xb
    return paired_difference(a, b)


def row(name: str, c: PairedComparison) -> str:
    lo, hi = c.ci95
    return (
        f"| {name} | {c.n} | {c.accuracy_a:.3f} | {c.accuracy_b:.3f} | {100 * c.difference:+.1f} "
        f"[{100 * lo:+.1f}, {100 * hi:+.1f}] | {c.p_value:.2g} | {c.only_b} fixed, {c.only_a} broken |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arm", type=parse_arm, action="append", required=True, metavar="NAME=BOTH,ONLY_A,ONLY_B,NEITHER"
    )
    args = parser.parse_args(argv)
    print("| arm | n | A | B | B - A [95% CI] | p | tasks |")
    print("|---|---|---|---|---|---|---|")
    for name, counts in args.arm:
        print(row(name, pooled([counts])))
    if len(args.arm) > 1:
        print(row(f"**pooled** ({len(args.arm)} arms)", pooled([counts for _, counts in args.arm])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
