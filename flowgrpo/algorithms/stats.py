"""Statistics for evaluation claims: intervals, pass@k, and paired tests between checkpoints.

Pure functions of counts (standard library only). An accuracy without its n and interval cannot
tell a gain from noise: at n = 100 and p = 0.6 the 95% interval is about ±10 points, so two
checkpoints are compared on the *same* tasks with a paired test, which cancels the variance of
task difficulty that two independent accuracies would carry.

- :func:`wilson_interval`: Wilson score interval of a binomial proportion (Wilson 1927; better
  coverage than the normal approximation near 0 or 1 and at small n).
- :func:`pass_at_k`: the unbiased estimator of pass@k from n samples with c correct (Chen et al. 2021,
  "Evaluating Large Language Models Trained on Code", eq. 1): ``1 - C(n-c, k) / C(n, k)``.
- :func:`mcnemar_exact`: exact two-sided McNemar test on the discordant pairs (b: only A right,
  c: only B right); under H0 each discordant pair is a fair coin, so p = P(Binomial(b + c, 1/2) as
  or more extreme).
- :func:`paired_difference`: the difference of two paired accuracies with a 95% interval
  (Newcombe 1998, method 10: Wilson intervals of each margin combined with the paired correlation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

Z95 = 1.959963984540054


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes in ``n`` trials; ``(0, 1)`` when ``n == 0``."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` samples of which ``c`` are correct (``k <= n``)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs at least k samples per task (have {n})")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the numerically stable form of 1 - C(n-c,k)/C(n,k).
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(samples: int, correct: Sequence[int], k: int) -> float:
    """pass@k averaged over tasks, each with ``samples`` samples and ``correct[i]`` of them right."""
    if not correct:
        return 0.0
    return sum(pass_at_k(samples, c, k) for c in correct) / len(correct)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts ``b`` and ``c``."""
    if b < 0 or c < 0:
        raise ValueError("discordant counts must be >= 0")
    n = b + c
    if n == 0:
        return 1.0
    lo = min(b, c)
    tail = sum(math.comb(n, i) for i in range(lo + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


class PairedComparison(BaseModel):
    """Two checkpoints scored on the same tasks (1 = correct)."""

    model_config = ConfigDict(frozen=True)

    n: int
    accuracy_a: float
    accuracy_b: float
    both: int  # concordant: both right
    only_a: int  # discordant: A right, B wrong
    only_b: int  # discordant: B right, A wrong
    difference: float  # accuracy_b - accuracy_a
    ci95: tuple[float, float]
    p_value: float  # exact McNemar, two-sided

    @property
    def counts(self) -> str:
        """The 2x2 table as ``BOTH,ONLY_A,ONLY_B,NEITHER``: all a paired test depends on, and what
        ``benchmarks.pool_tables --arm NAME=...`` takes to pool it with arms of other runs."""
        return f"{self.both},{self.only_a},{self.only_b},{self.n - self.both - self.only_a - self.only_b}"

    def summary(self, name_a: str = "A", name_b: str = "B") -> str:
        lo, hi = self.ci95
        return (
            f"{name_a} {self.accuracy_a:.3f} -> {name_b} {self.accuracy_b:.3f} on the same {self.n} tasks: "
            f"{100 * self.difference:+.1f} points (95% CI {100 * lo:+.1f} to {100 * hi:+.1f}); "
            f"only {name_a} right {self.only_a}, only {name_b} right {self.only_b}; "
            f"McNemar exact p = {self.p_value:.2g}"
        )


def paired_difference(a: Sequence[bool | int], b: Sequence[bool | int], z: float = Z95) -> PairedComparison:
    """Compare paired binary outcomes ``a`` and ``b`` (same tasks, same order).

    The interval is Newcombe's method 10 for a difference of paired proportions: the Wilson limits
    of each accuracy, combined with the phi correlation of the 2x2 table.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need equal lengths, got {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        raise ValueError("no paired outcomes to compare")
    both = sum(1 for x, y in zip(a, b, strict=True) if x and y)
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    neither = n - both - only_a - only_b
    ka, kb = both + only_a, both + only_b
    pa, pb = ka / n, kb / n
    la, ua = wilson_interval(ka, n, z)
    lb, ub = wilson_interval(kb, n, z)
    denom = (both + only_a) * (neither + only_b) * (both + only_b) * (neither + only_a)
    phi = 0.0
    if denom > 0:
        phi = (both * neither - only_a * only_b) / math.sqrt(denom)
        if both * neither - only_a * only_b > 0:
            # Newcombe's continuity-corrected numerator: max(AD - BC - n/2, 0).
            phi = max(both * neither - only_a * only_b - n / 2, 0.0) / math.sqrt(denom)
    d = pb - pa
    lower = d - math.sqrt(max(0.0, (pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa) + (ua - pa) ** 2))
    upper = d + math.sqrt(max(0.0, (ub - pb) ** 2 - 2 * phi * (ub - pb) * (pa - la) + (pa - la) ** 2))
    return PairedComparison(
        n=n,
        accuracy_a=pa,
        accuracy_b=pb,
        both=both,
        only_a=only_a,
        only_b=only_b,
        difference=d,
        ci95=(max(-1.0, lower), min(1.0, upper)),
        p_value=mcnemar_exact(only_a, only_b),
    )


__all__ = [
    "PairedComparison",
    "mcnemar_exact",
    "mean_pass_at_k",
    "paired_difference",
    "pass_at_k",
    "wilson_interval",
]
