"""How does a model behave as the 1-5 rubric judge of ``examples/gsm8k_quality.yaml``?

    python -m benchmarks.judge_rubric RUN/trajectories/step_000001.jsonl [...] --n 64

Serves the judge model (``--judge``, default the embedded SmolLM2) with ``flowgrpo serve``'s server
on a free loopback port, scores saved ``gsm8k`` episodes with the recipe's own judge settings
(template, ``score_range``) through that endpoint, and reports over the first ``n`` episodes: the
share of replies that hold a 1-5 score (Wilson 95% interval; the rest would be excluded from
training), the mean normalised score on right and on wrong answers (exact match), and the AUC of
the score as a detector of right answers (0.5: chance). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from benchmarks.verifier_agreement import auc
from flowgrpo.algorithms.stats import wilson_interval
from flowgrpo.env import make
from flowgrpo.gateway.serve import make_server, serve_in_thread
from flowgrpo.rewards import JudgeReward, Missing
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.runs.export import load_served_policy
from flowgrpo.runs.store import read_trajectories
from flowgrpo.types import TrajectoryGroup
from flowgrpo.utils.aio import run_sync

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "gsm8k_quality.yaml"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--judge", default="smollm2-135m", help="a model `flowgrpo serve --model` takes")
    args = ap.parse_args(argv)
    trajs = [t for f in args.files for t in read_trajectories(f) if "accuracy" in t.reward_breakdown][
        : args.n
    ]
    env = make("gsm8k")
    tasks = {t.id: t for split in ("train", "test") for t in env.tasks(split)}
    groups = [TrajectoryGroup(task=tasks[t.task_id], trajectories=[t]) for t in trajs]
    [spec] = [r for r in yaml.safe_load(RECIPE.read_text())["rewards"] if r["name"] == "judge"]
    model, tok = load_served_policy(args.judge)  # what `flowgrpo serve --model` loads
    server = make_server(HFBackend(model, tok), tok, model_name=args.judge, host="127.0.0.1", port=0)
    serve_in_thread(server)
    try:
        kwargs = {**spec["kwargs"], "base_url": f"{server.url}/v1", "model": args.judge, "timeout_s": 600}
        judge = JudgeReward(**kwargs)
        t0 = time.monotonic()
        scores = [s[0] for s in run_sync(judge.ascore_groups(groups))]
        wall = time.monotonic() - t0
    finally:
        server.shutdown()
        server.server_close()
    right = [t.reward_breakdown["accuracy"] == 1.0 for t in trajs]
    scored = [(float(s), r) for s, r in zip(scores, right, strict=True) if not isinstance(s, Missing)]
    on_right = [s for s, r in scored if r]
    on_wrong = [s for s, r in scored if not r]
    n = len(trajs)
    out = {
        "n": n,
        "judge": args.judge,
        "right_answers": sum(right),
        "scored": len(scored),
        "scored_ci95": wilson_interval(len(scored), n),
        "mean_score_right": sum(on_right) / len(on_right) if on_right else None,
        "mean_score_wrong": sum(on_wrong) / len(on_wrong) if on_wrong else None,
        "auc": auc(on_right, on_wrong),
        "wall_s": wall,
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
