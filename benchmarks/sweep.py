"""The sweep's table and plot, from the arms ``benchmarks.learning`` recorded.

    python -m benchmarks.sweep                                   # every arm under runs/arms
    python -m benchmarks.sweep grpo-8min rloo-8min --plot docs/img/sweep.png
    python -m benchmarks.sweep --versus grpo-8min                 # each arm against another arm

Reads ``ROOT/NAME/arm.json`` and prints one markdown row per arm: its overrides, the warm start it
started from (arms share one when the config's model, environment and ``sft`` section agree) and
that warm start's held-out accuracy, steps and training minutes, seconds per step,
held-out accuracy after training with its Wilson 95% interval, the paired difference with the warm
start (exact McNemar p), and peak RSS. ``--versus NAME`` adds the paired difference of each arm's
final evaluation with arm NAME's, on the tasks both evaluated; arms whose environment is configured
otherwise (another level, another seed) answered other problems under the same task ids and get no
such cell. ``--plot`` draws held-out accuracy against training minutes,
one panel per held-out set (environment configuration), so curves are only ever drawn beside
curves on the same tasks; arms from different warm starts start from their own points.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.learning import warm_key
from flowgrpo.runs.evaluation import EvalResult, compare
from flowgrpo.runs.rundir import RunDir


def load_arms(root: Path, names: list[str]) -> list[dict[str, Any]]:
    paths = [root / n / "arm.json" for n in names] if names else sorted(root.glob("*/arm.json"))
    arms = []
    for p in paths:
        if not p.is_file():
            raise SystemExit(f"error: {p} does not exist (an arm still running, or a wrong name?)")
        arm = json.loads(p.read_text())
        cfg = RunDir(p.parent).config()  # the config the arm ran with, whatever its file says today
        arm["warm_key"], arm["env"] = warm_key(cfg), cfg.env.model_dump(mode="json")
        arm["tasks"] = json.dumps(arm["env"], sort_keys=True)  # one held-out set per environment config
        arm["dir"] = p.parent
        arms.append(arm)
    return arms


def final_eval(arm: dict[str, Any]) -> EvalResult:
    """The arm's last recorded evaluation (the one ``arm.json``'s ``final`` summarises)."""
    return RunDir(arm["dir"]).evals()[-1]


def versus(arm: dict[str, Any], ref: dict[str, Any], ref_final: EvalResult) -> str:
    if arm is ref:
        return "-"
    if arm["tasks"] != ref["tasks"]:
        return "(other tasks)"
    cmp = compare(ref_final, final_eval(arm))
    lo, hi = cmp.ci95
    return f"{100 * cmp.difference:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}], p = {cmp.p_value:.2g}"


def row(arm: dict[str, Any]) -> str:
    cmp, fin = arm["vs_warm"], arm["final"]
    over = " ".join(f"`{o}`" for o in arm["overrides"]) or "(recipe)"
    if arm["control"] == "sft":
        over += " (SFT control)"
    step_s = f"{statistics.median(arm['step_s']):.0f}" if arm.get("step_s") else "-"  # older arms lack it
    rss = f"{arm['peak_rss_mb'] / 1024:.1f}" if "peak_rss_mb" in arm else "-"
    lo, hi = fin["ci95"]
    dlo, dhi = cmp["ci95"]
    return (
        f"| {arm['name']} | {over} | {arm['warm_key'][:6]}: {cmp['accuracy_a']:.3f} | "
        f"{arm['steps']} ({arm['train_min']:.1f}) | {step_s} | {fin['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] | "
        f"{100 * cmp['difference']:+.1f} [{100 * dlo:+.1f}, {100 * dhi:+.1f}], p = {cmp['p_value']:.2g} | "
        f"{rss} |"
    )


def plot(arms: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(a["tasks"] for a in arms))
    fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 4.5), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        mine = [a for a in arms if a["tasks"] == key]
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # 20 distinct colours: no two arms share one
        for a in mine:
            x = [c["train_min"] for c in a["curve"]]
            y = [c["accuracy"] for c in a["curve"]]
            err = [
                [c["accuracy"] - c["ci95"][0] for c in a["curve"]],
                [c["ci95"][1] - c["accuracy"] for c in a["curve"]],
            ]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=a["name"], alpha=0.8)
        env = mine[0]["env"]
        kwargs = ", ".join(
            f"{k}={v}" for k, v in sorted(env["kwargs"].items()) if k not in ("seed", "num_test")
        )
        ax.set_title(f"{env['name']} {kwargs}: {mine[0]['final']['n']} held-out tasks, greedy", fontsize=10)
        ax.set_xlabel("training minutes (rollout + update)")
        ax.set_ylabel("held-out accuracy (95% Wilson interval)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="arm names (default: every arm under --root)")
    ap.add_argument("--root", default="runs/arms")
    ap.add_argument("--plot", type=Path, help="write a PNG of the curves here")
    ap.add_argument(
        "--versus", metavar="NAME", help="also compare every arm's final evaluation with this arm's"
    )
    args = ap.parse_args(argv)
    root = Path(args.root)
    arms = load_arms(root, args.names)
    if not arms:
        raise SystemExit(f"error: no arm.json under {args.root}: run python -m benchmarks.learning first")
    ref = None
    if args.versus:
        ref = next((a for a in arms if a["name"] == args.versus), None) or load_arms(root, [args.versus])[0]
    head = (
        "| arm | overrides | warm start: accuracy | steps (train min) | s/step | held-out after [95% CI] "
        "| vs warm [95% CI], p | peak RSS GB |"
    )
    print(head + (f" vs {args.versus} [95% CI], p |" if ref else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if ref else ""))
    ref_final = final_eval(ref) if ref else None
    for arm in arms:
        print(row(arm) + (f" {versus(arm, ref, ref_final)} |" if ref else ""))
    if args.plot:
        plot(arms, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
