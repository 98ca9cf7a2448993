"""Answer checking: our ``math_equal`` against Hugging Face's ``math-verify`` (the checker TRL and
open-r1 use), on the project's labelled math cases and on real final answers of the demo's policy.

    .venv/bin/python -m benchmarks.math_verify_agreement [--runs runs/arms] [--json OUT]

Labelled cases: the parametrised cases of ``tests/test_rewards.py`` (equal and not-equal pairs),
read from the test functions' marks so the two lists never drift apart. Real answers: the final
answers of every recorded evaluation episode under ``--runs`` (the arithmetic environment, GSM8K-
style word problems) against their tasks' gold answers; unlabelled, so the table gives agreement
and lists the disagreements to read. math-verify is called as open-r1 does,
``verify(parse(gold), parse(pred))`` with its default timeouts (5 s each, by SIGALRM: they work in
the main thread only, so this script calls it there; our reward runs in a worker thread, where
math-verify would run unbounded: ``9**9**9**9`` never returns with the timeouts off).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any


def labelled_cases() -> list[tuple[str | None, str, bool]]:
    from tests import test_rewards

    out = []
    for fn, label in ((test_rewards.test_math_equal_true, True), (test_rewards.test_math_equal_false, False)):
        (mark,) = [m for m in fn.pytestmark if m.name == "parametrize"]
        out += [(pred, gold, label) for pred, gold in mark.args[1]]
    return out


def real_answers(runs: Path) -> list[tuple[str | None, str]]:
    """(final answer, gold) of the recorded arithmetic evaluation episodes under ``runs``."""
    from flowgrpo.components import env_factory_of
    from flowgrpo.config import EnvConfig
    from flowgrpo.rewards.base import final_answer
    from flowgrpo.runs.store import read_trajectories

    env = env_factory_of(EnvConfig(name="arithmetic"))()
    gold = {t.id: t.answer for split in ("train", "test") for t in env.tasks(split)}
    pairs = []
    for f in sorted(runs.glob("*/eval/*.jsonl")):
        for traj in read_trajectories(f):
            if traj.env == "arithmetic" and traj.task_id in gold:
                pairs.append((final_answer(traj), gold[traj.task_id]))
    return pairs


def math_verify_equal(pred: str | None, gold: str, *, latex: bool = False) -> bool:
    """``latex``: both sides wrapped in ``$...$`` (math-verify extracts LaTeX only between
    delimiters; a bare ``\\frac12`` or ``2^{10}`` is not read as LaTeX otherwise)."""
    from math_verify import parse, verify

    if pred is None:
        return False
    if latex:
        pred, gold = f"${pred}$", f"${gold}$"
    try:
        return bool(verify(parse(gold), parse(pred)))  # its default 5 s alarms: main thread only
    except Exception:
        return False


def judge(pairs: list[tuple[str | None, str]]) -> list[dict[str, Any]]:
    from flowgrpo.rewards.answers import math_equal

    rows = []
    for pred, gold in pairs:
        t0 = time.perf_counter()
        ours = math_equal(pred, gold)
        t1 = time.perf_counter()
        theirs = math_verify_equal(pred, gold)
        t2 = time.perf_counter()
        wrapped = math_verify_equal(pred, gold, latex=True)
        rows.append(
            {
                "pred": pred,
                "gold": gold,
                "ours": ours,
                "mv": theirs,
                "mv_latex": wrapped,
                "ours_s": t1 - t0,
                "mv_s": t2 - t1,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs/arms", help="folder of run directories with recorded evaluations")
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args()

    cases = labelled_cases()
    rows = judge([(p, g) for p, g, _ in cases])
    print(f"labelled cases (tests/test_rewards.py): n = {len(rows)}")
    tally = Counter()
    for r, (_, _, label) in zip(rows, cases, strict=True):
        tally[(r["ours"] == label, r["mv"] == label)] += 1
        if r["ours"] != label or r["mv"] != label:
            print(
                f"  expected {label!s:5}  ours {r['ours']!s:5}  math-verify {r['mv']!s:5}  {r['pred']!r} vs {r['gold']!r}"
            )
    print("| | math-verify right | math-verify wrong |\n|---|---|---|")
    print(f"| ours right | {tally[(True, True)]} | {tally[(True, False)]} |")
    print(f"| ours wrong | {tally[(False, True)]} | {tally[(False, False)]} |")
    labels = [label for _, _, label in cases]
    mv_right = sum(r["mv_latex"] == lab for r, lab in zip(rows, labels, strict=True))
    ours_right = sum(r["ours"] == lab for r, lab in zip(rows, labels, strict=True))
    print(
        f"math-verify with $...$ around both sides: {mv_right}/{len(rows)} right; ours {ours_right}/{len(rows)}"
    )
    for r, label in zip(rows, labels, strict=True):
        if r["mv_latex"] != label:
            print(f"  $-wrapped math-verify wrong: {r['pred']!r} vs {r['gold']!r} (expected {label})")

    pairs = real_answers(Path(args.runs))
    distinct = list(dict.fromkeys(pairs))  # the same (answer, gold) recurs across evaluations
    print(f"\n{len(pairs)} real episodes, {len(distinct)} distinct (answer, gold) pairs", flush=True)
    real = judge(distinct)
    agree = sum(r["ours"] == r["mv"] for r in real)
    print(
        f"\nreal final answers (arithmetic eval episodes under {args.runs}): n = {len(real)}, agree {agree}"
    )
    both = Counter((r["ours"], r["mv"]) for r in real)
    wrapped_agree = sum(r["ours"] == r["mv_latex"] for r in real)
    print(f"$-wrapped math-verify agrees with ours on {wrapped_agree}/{len(real)}")
    print("| | math-verify equal | math-verify not equal |\n|---|---|---|")
    print(f"| ours equal | {both[(True, True)]} | {both[(True, False)]} |")
    print(f"| ours not equal | {both[(False, True)]} | {both[(False, False)]} |")
    seen = set()
    for r in real:
        key = (r["pred"], r["gold"])
        if r["ours"] != r["mv"] and key not in seen:
            seen.add(key)
            print(f"  ours {r['ours']!s:5}  math-verify {r['mv']!s:5}  {r['pred']!r} vs {r['gold']!r}")
    everything = rows + real
    for who in ("ours", "mv"):
        times = sorted(r[f"{who}_s"] for r in everything)
        print(f"{who}: median {1e3 * times[len(times) // 2]:.2f} ms, max {1e3 * times[-1]:.1f} ms per check")
    if args.json:
        Path(args.json).write_text(json.dumps({"labelled": rows, "real": real}, indent=1))


if __name__ == "__main__":
    main()
