"""How well does a verifier's P(Yes) agree with the exact-match accuracy reward?

    python -m benchmarks.verifier_agreement RUN/eval/A.jsonl [RUN/eval/B.jsonl ...] --n 200

Reads saved calculator-agent trajectories (episodes of the ``arithmetic`` environment, scored by
``accuracy``), asks the verifier (``--verifier``, default the embedded SmolLM2) "is this final answer
correct?" through :class:`flowgrpo.rewards.VerifierReward`, and reports, over the first ``n``
episodes: the agreement of ``P(Yes) > threshold`` with exact match (Wilson 95% interval), the
verifier's mean P(Yes) on right and on wrong answers, and the AUC of P(Yes) as a detector of right
answers (0.5: no better than chance). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

from flowgrpo.algorithms.stats import wilson_interval
from flowgrpo.env import make
from flowgrpo.rewards import VerifierReward
from flowgrpo.runs.store import read_trajectories
from flowgrpo.types import TrajectoryGroup
from flowgrpo.utils.aio import run_sync


def auc(pos: list[float], neg: list[float]) -> float:
    """P(a random right answer scores above a random wrong one), ties counting half."""
    if not pos or not neg:
        return float("nan")
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--verifier", default="smollm2-135m")
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args(argv)
    trajs = [t for f in args.files for t in read_trajectories(f) if "accuracy" in t.reward_breakdown][
        : args.n
    ]
    env = make("arithmetic")
    tasks = {t.id: t for split in ("train", "test") for t in env.tasks(split)}
    groups = [TrajectoryGroup(task=tasks[t.task_id], trajectories=[t]) for t in trajs]
    t0 = time.monotonic()
    verifier = VerifierReward(hf_model=args.verifier, batch_size=args.batch_size)
    scores = [s[0] for s in run_sync(verifier.ascore_groups(groups))]
    wall = time.monotonic() - t0
    right = [t.reward_breakdown["accuracy"] == 1.0 for t in trajs]
    p = [float(s) if isinstance(s, float) else float("nan") for s in scores]
    agree = sum((pi > args.threshold) == r for pi, r in zip(p, right, strict=True))
    n = len(trajs)
    out = {
        "n": n,
        "verifier": args.verifier,
        "right_answers": sum(right),
        "agreement": agree / n,
        "agreement_ci95": wilson_interval(agree, n),
        "threshold": args.threshold,
        "mean_p_yes_right": sum(pi for pi, r in zip(p, right, strict=True) if r) / max(1, sum(right)),
        "mean_p_yes_wrong": sum(pi for pi, r in zip(p, right, strict=True) if not r) / max(1, n - sum(right)),
        "auc": auc(
            [pi for pi, r in zip(p, right, strict=True) if r],
            [pi for pi, r in zip(p, right, strict=True) if not r],
        ),
        "always_yes_agreement": sum(right) / n,
        "wall_s": wall,
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
