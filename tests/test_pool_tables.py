"""benchmarks.pool_tables: a paired test rebuilt from 2x2 counts matches the one on the outcomes."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.pool_tables import outcomes, parse_arm, pooled
from flowgrpo.algorithms.stats import paired_difference


def test_outcomes_have_the_table_they_were_built_from() -> None:
    a, b = outcomes(2, 1, 3, 4)
    assert len(a) == len(b) == 10
    assert sum(1 for x, y in zip(a, b, strict=True) if x and y) == 2
    assert sum(1 for x, y in zip(a, b, strict=True) if x and not y) == 1
    assert sum(1 for x, y in zip(a, b, strict=True) if y and not x) == 3
    assert sum(1 for x, y in zip(a, b, strict=True) if not x and not y) == 4


def test_one_arm_gives_the_printed_figures_of_its_own_run() -> None:
    # docs/learning.md section 40, seed 1: step 30 (156 of 191) -> step 150 (190 of 191),
    # 35 fixed, 1 broken: +17.8 [+12.3, +23.9], p = 1.1e-09.
    c = pooled([(155, 1, 35, 0)])
    assert c.n == 191 and c.only_a == 1 and c.only_b == 35 and c.counts == "155,1,35,0"
    assert round(100 * c.difference, 1) == 17.8
    assert (round(100 * c.ci95[0], 1), round(100 * c.ci95[1], 1)) == (12.3, 23.9)
    assert f"{c.p_value:.2g}" == "1.1e-09"


def test_pooled_is_the_table_of_the_summed_counts() -> None:
    arms = [(184, 3, 3, 1), (155, 1, 35, 0), (181, 0, 8, 2)]
    # Concatenating the arms' pairs gives one 2x2 table whose cells are the sums: 520, 4, 46, 3.
    a, b = outcomes(520, 4, 46, 3)
    c = pooled(arms)
    assert c == paired_difference(a, b)
    # docs/learning.md section 45: 0.914 -> 0.988, +7.3 [+5.1, +9.9], p = 4.5e-10, n = 573.
    assert c.n == 573 and c.only_b == 46 and c.only_a == 4
    assert (round(c.accuracy_a, 3), round(c.accuracy_b, 3)) == (0.914, 0.988)
    assert (round(100 * c.ci95[0], 1), round(100 * c.ci95[1], 1)) == (5.1, 9.9)
    assert f"{c.p_value:.2g}" == "4.5e-10"


def test_parse_arm_says_how_to_write_an_arm() -> None:
    assert parse_arm("seed0=184,3,3,1") == ("seed0", (184, 3, 3, 1))
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=BOTH,ONLY_A,ONLY_B,NEITHER"):
        parse_arm("seed0=184,3,3")
