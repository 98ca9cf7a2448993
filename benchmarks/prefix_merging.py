"""Prefix merging: tokens processed per update with packed episodes vs one row per turn.

A multi-turn episode's turn ``k`` is sampled from the context ``prompt + (action, observation)*k``.
One row per turn re-encodes that whole context for every turn; a packed row
(:func:`flowgrpo.training.batching.build_rows`, ``pack=True``) holds the episode once and scores every
action in one causal pass, with the same per-token loss. This script builds synthetic trajectories
from :mod:`flowgrpo.types` with realistic per-turn sizes (a 150-token system+question prompt,
40-token actions, 20-token observations including the chat template's delimiters), runs both
layouts through ``build_rows`` and prints, for 1-, 2-, 4- and 8-turn episodes:

- tokens processed per update (the sum of row lengths) and their ratio;
- training FLOPs of both layouts for SmolLM2-135M's shape (the formula of
  :mod:`benchmarks.update_mfu`, attention included). The FLOP ratio is a little below the token
  ratio: the LM head runs only at action positions, the same in both layouts, and one long packed
  row pays a larger attention square than its per-turn pieces;
- with ``--measure``, the measured forward+backward seconds of both layouts on the chosen model.

    python -m benchmarks.prefix_merging                 # instant (counts only)
    python -m benchmarks.prefix_merging --measure       # ~3 min on 2 cores (SmolLM2-135M, bf16)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import fmt_table, median

SMOLLM2_SHAPE = {
    "layers": 30,
    "hidden": 576,
    "attn_dim": 576,
    "vocab": 49152,
    "linear_params": 30 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536),
}
"""SmolLM2-135M: 30 layers, d=576, 9 query heads and 3 KV heads of 64, MLP 1536, vocab 49152."""


def synthetic_trajectory(
    turns: int, *, prompt: int = 150, action: int = 40, obs: int = 20, vocab: int = 49152, seed: int = 0
) -> Any:
    """A trajectory of ``turns`` turns with the given per-turn token counts and an advantage on
    every turn (random ids; only the lengths matter here)."""
    import random

    from flowgrpo.types import Message, Trajectory, Turn

    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    out = []
    for k in range(turns):
        out.append(
            Turn(
                prompt_ids=ids(prompt if k == 0 else obs),
                action_ids=ids(action),
                action_logprobs=[-1.0] * action,
                action=Message(role="assistant", content=""),
                advantage=1.0,
            )
        )
    return Trajectory(turns=out)


def layout_costs(turns: int, group: int = 8, **sizes: int) -> dict[str, Any]:
    """Rows, tokens and training FLOPs of ``group`` episodes of ``turns`` turns, packed vs per turn."""
    from benchmarks.update_mfu import ModelShape, train_flops
    from flowgrpo.training.batching import build_rows

    trajs = [synthetic_trajectory(turns, seed=i, **sizes) for i in range(group)]
    shape = ModelShape(**SMOLLM2_SHAPE)
    out: dict[str, Any] = {"turns": turns, "episodes": group}
    for name, pack in (("packed", True), ("per_turn", False)):
        rows = build_rows(trajs, pack=pack)
        out[name] = {
            "rows": len(rows),
            "tokens": sum(len(r) for r in rows),
            "action_tokens": sum(r.num_action_tokens for r in rows),
            "tflops": sum(train_flops(shape, len(r), r.num_action_tokens) for r in rows) / 1e12,
        }
    assert out["packed"]["action_tokens"] == out["per_turn"]["action_tokens"]
    out["token_ratio"] = out["per_turn"]["tokens"] / out["packed"]["tokens"]
    out["flop_ratio"] = out["per_turn"]["tflops"] / out["packed"]["tflops"]
    return out


def measure_layouts(
    turns: int, group: int, model: Any, *, autocast: str | None, reps: int = 2, token_budget: int = 4096
) -> dict[str, float]:
    """Median seconds of forward+backward over all micro-batches, packed vs per turn."""
    from flowgrpo.algorithms.loss import policy_loss
    from flowgrpo.modeling.logprobs import action_logprobs
    from flowgrpo.training.batching import build_rows, micro_batches

    trajs = [synthetic_trajectory(turns, seed=i, vocab=model.config.vocab_size) for i in range(group)]
    res = {}
    for name, pack in (("packed", True), ("per_turn", False)):
        mbs = micro_batches(build_rows(trajs, pack=pack), token_budget)

        def once(mbs=mbs) -> None:
            for mb in mbs:
                lp, _ = action_logprobs(
                    model, mb.input_ids, mb.attention_mask, mb.loss_mask, autocast_dtype=autocast
                )
                loss, _ = policy_loss(
                    lp, mb.old_logprobs, mb.advantages, mb.loss_mask, token_weights=mb.token_weights
                )
                loss.backward()
            model.zero_grad(set_to_none=True)

        once()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
        res[name] = median(times)
    res["time_ratio"] = res["per_turn"] / res["packed"]
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", default="1,2,4,8")
    p.add_argument("--group", type=int, default=8, help="episodes per update")
    p.add_argument("--prompt", type=int, default=150)
    p.add_argument("--action", type=int, default=40)
    p.add_argument("--obs", type=int, default=20)
    p.add_argument("--measure", action="store_true", help="also time fwd+bwd of both layouts")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--weights", choices=["bf16", "amp"], default="bf16")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    turns = [int(t) for t in a.turns.split(",")]
    sizes = {"prompt": a.prompt, "action": a.action, "obs": a.obs}
    costs = [layout_costs(t, a.group, **sizes) for t in turns]
    print(
        f"{a.group} episodes per update; prompt {a.prompt}, action {a.action}, observation {a.obs} tokens per turn"
    )
    table = [
        [
            c["turns"],
            c["packed"]["rows"],
            c["per_turn"]["rows"],
            c["packed"]["tokens"],
            c["per_turn"]["tokens"],
            f"{c['token_ratio']:.2f}x",
            f"{c['flop_ratio']:.2f}x",
        ]
        for c in costs
    ]
    header = [
        "turns",
        "rows packed",
        "rows per turn",
        "tokens packed",
        "tokens per turn",
        "token ratio",
        "FLOP ratio (SmolLM2)",
    ]
    if a.measure:
        from benchmarks._common import load_policy

        model, _ = load_policy(a.model, dtype="bfloat16" if a.weights == "bf16" else "float32")
        model.train()
        for c, row in zip(costs, table, strict=True):
            m = measure_layouts(
                c["turns"], a.group, model, autocast="bfloat16" if a.weights == "amp" else None
            )
            c["measured"] = m
            row += [f"{m['packed']:.2f}", f"{m['per_turn']:.2f}", f"{m['time_ratio']:.2f}x"]
            print(
                f"  {c['turns']} turns: packed {m['packed']:.2f} s, per turn {m['per_turn']:.2f} s",
                flush=True,
            )
        header += ["fwd+bwd s packed", "fwd+bwd s per turn", "time ratio"]
    print(fmt_table(table, header))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(costs, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
