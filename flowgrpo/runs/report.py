"""A run as one static HTML page, and a PNG of its curves.

:func:`build_report` writes ``RUN/report.html``: reward and accuracy curves (inline SVG drawn here,
no plotting library in the page), small multiples of every other logged metric, the per-step
metrics table (``metrics.jsonl``), the evaluations (``eval.jsonl``) and trajectories shown *as the
trainer saw them*: every stored token, coloured by loss mask (prompt and observation tokens are
context, never trained on; sampled action tokens are) and by the turn's advantage (green for
positive, red for negative, intensity proportional to ``|A|``). Seeing the mask is the quickest way
to catch the classic multi-turn bug of training on observation tokens, and seeing the advantages
next to the text shows what the update will reinforce.

The page is self-contained (no external script, style sheet, font or image), so it can be mailed or
opened from an artifact store. All text from the run goes through :func:`html.escape`:
trajectories hold model output, which can contain anything. A few lines of inline JavaScript fill
the summary box from the metrics embedded as JSON (and toggle the colouring); everything else is
static.

:func:`plot_run` writes ``RUN/plot.png`` (matplotlib, Agg backend): reward and accuracy against the
step; the trainer calls it at the end of a run.
"""

from __future__ import annotations

import html
import itertools
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flowgrpo.chat.parsing import extract_answer
from flowgrpo.rollout.agentflow.render import flow_html
from flowgrpo.runs.evaluation import EvalResult
from flowgrpo.runs.replay import load_tokenizer_for_run
from flowgrpo.runs.rundir import MetricRecord, RunDir, RunError
from flowgrpo.types import Trajectory

log = logging.getLogger(__name__)

METRIC_TITLES = {
    "reward_mean": "mean reward",
    "kl": "KL to the reference",
    "entropy": "entropy (nats/token)",
    "action_tokens": "response tokens per step",
    "turns_mean": "turns per episode",
    "clip_frac": "clip fraction",
    "grad_norm": "grad norm (before clipping)",
}
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]


# ---------------------------------------------------------------------------------------------
# PNG plot
# ---------------------------------------------------------------------------------------------


def _series(records: Sequence[Mapping[str, Any]], key: str) -> list[tuple[float, float]]:
    """``(step, value)`` for records where both are finite numbers."""
    out = []
    for i, r in enumerate(records):
        x, y = r.get("step", i + 1), r.get(key)
        if _is_num(x) and _is_num(y):
            out.append((float(x), float(y)))
    return out


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _evals_by_split(evals: Sequence[EvalResult]) -> dict[str, list[EvalResult]]:
    by_split: dict[str, list[EvalResult]] = {}
    for e in evals:
        by_split.setdefault(e.split, []).append(e)
    return by_split


def _eval_series(evals: Sequence[EvalResult]) -> dict[str, list[tuple[float, float]]]:
    """Held-out accuracy against the step, per split."""
    return {
        split: [(float(e.step), e.accuracy) for e in recs if _is_num(e.accuracy)]
        for split, recs in _evals_by_split(evals).items()
    }


def _metric_rows(metrics: Sequence[MetricRecord]) -> list[dict[str, Any]]:
    """Metric records as flat rows ``{"step": N, name: value, ...}`` (the table's and the charts' form)."""
    return [{"step": m.step, **m.values} for m in metrics]


# What an RL practitioner reads first, in this order; the rest follows grouped by section.
KEY_METRICS = (
    "reward_mean",
    "accuracy",
    "kl",
    "entropy",
    "action_tokens",
    "turns_mean",
    "clip_frac",
    "grad_norm",
)
SECTIONS = (  # (title, predicate on a metric name), first match wins
    ("held-out evaluation", lambda k: k.startswith("eval/")),
    ("timing", lambda k: k.startswith("time/") or k.endswith("tokens_per_s")),
    (
        "update",
        lambda k: (
            k in ("loss", "lr", "optimizer_steps", "train_tokens", "skipped", "nan_skipped_steps")
            or k.startswith(("pg_", "ratio", "is_", "value", "vf_"))
        ),
    ),
    ("rollout", lambda k: True),
)


def is_warm_start_row(row: Mapping[str, Any]) -> bool:
    """A row the supervised warm start logged (``sft/*`` only): not an RL step."""
    keys = [k for k in row if k != "step"]
    return bool(keys) and all(k.startswith("sft/") for k in keys)


def metric_order(names: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``[("key metrics", [...]), (section, [...]), ...]``: the key metrics in :data:`KEY_METRICS`
    order, then every other name under the first section whose predicate takes it."""
    names = [n for n in dict.fromkeys(names) if n != "step"]
    out = [("key metrics", [k for k in KEY_METRICS if k in names])]
    rest = [n for n in names if n not in KEY_METRICS and not n.startswith("sft/")]
    for title, pred in SECTIONS:
        mine = [n for n in rest if pred(n)]
        rest = [n for n in rest if n not in mine]
        out.append((title, mine))
    return [(t, ks) for t, ks in out if ks]


def plot_run(run_dir: str | os.PathLike) -> Path:
    """Write ``RUN/plot.png``: mean reward and accuracy (train, and each eval split) vs step."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    run = RunDir(run_dir)
    metrics = [r for r in _metric_rows(run.metrics()) if not is_warm_start_row(r)]
    extra = [k for k in KEY_METRICS[2:] if _series(metrics, k)]
    cols = 4
    rows = 1 + math.ceil(len(extra) / cols) if extra else 1
    fig, axes = plt.subplots(rows, cols if extra else 2, figsize=(14 if extra else 10, 3.4 * rows), dpi=100)
    flat = list(axes.flat)
    ax_r, ax_a = flat[0], flat[1]
    for ax, key in zip(flat[cols:] if extra else [], extra, strict=False):
        ax.plot(*zip(*_series(metrics, key), strict=True), marker="o", ms=3, color=PALETTE[0])
        ax.set_title(METRIC_TITLES.get(key, key), fontsize=10)
    for ax in flat[2:cols] + flat[cols + len(extra) :] if extra else []:
        ax.axis("off")
    try:
        rew = _series(metrics, "reward_mean")
        if rew:
            ax_r.plot(*zip(*rew, strict=True), marker="o", ms=3, color=PALETTE[0], label="train")
        ax_r.set_title("mean reward")
        acc = _series(metrics, "accuracy")
        if acc:
            ax_a.plot(*zip(*acc, strict=True), marker="o", ms=3, color=PALETTE[0], label="train (sampled)")
        greedy = [e for e in run.evals() if e.greedy and e.label != "untrained"]
        for i, (split, recs) in enumerate(sorted(_evals_by_split(greedy).items())):
            pts = [(float(e.step), e.accuracy, e.ci95) for e in recs]
            if pts:
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                err = None
                if all(p[2] for p in pts):  # 95% intervals as error bars
                    err = [[y - p[2][0] for y, p in zip(ys, pts, strict=True)],
                           [p[2][1] - y for y, p in zip(ys, pts, strict=True)]]  # fmt: skip
                ax_a.errorbar(
                    xs,
                    ys,
                    yerr=err,
                    marker="s",
                    ms=4,
                    ls="--",
                    capsize=3,
                    color=PALETTE[(i + 1) % 7],
                    label=f"held-out {split}, greedy" + (" (95% CI)" if err else ""),
                )
                for e, x, y in zip(recs, xs, ys, strict=True):
                    ax_a.annotate(f"n={e.n}", (x, y), textcoords="offset points", xytext=(6, -10), fontsize=7)
        ax_a.set_title("accuracy")
        for ax in flat:
            if not ax.axison:
                continue
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.ticklabel_format(axis="y", useOffset=False)  # a ratio near 1 reads 0.9999, not "+1"
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="best")
            elif not ax.lines:
                ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
        fig.suptitle(run.name, fontsize=10)
        fig.tight_layout()
        out = run.path / "plot.png"
        fig.savefig(out)
    finally:
        plt.close(fig)
    return out


# ---------------------------------------------------------------------------------------------
# Inline SVG charts
# ---------------------------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, n: int = 5, *, integer: bool = False) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]`` (1, 2, 2.5 or 5 times a power of ten;
    whole numbers only when ``integer``, e.g. for steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, float(round(step)))
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Labels for evenly spaced ``ticks`` with as many digits as their spacing needs, so ticks of
    a ratio near 1 never all read "1": spacing below 1e-4 of the values is shown as offsets from
    a round base ("1-5.0e-07"), very large or small values in scientific notation."""
    gaps = [abs(b - a) for a, b in itertools.pairwise(ticks) if b != a]
    if not gaps:
        return [_fmt(t) for t in ticks]
    step, big = min(gaps), max(abs(t) for t in ticks)
    if big and step / big < 1e-4:
        base = float(f"{ticks[len(ticks) // 2]:.3g}")
        return [f"{base:g}" if t == base else f"{base:g}{t - base:+.1e}" for t in ticks]
    if big >= 1e6 or 0 < big < 1e-3:
        digits = max(1, math.ceil(math.log10(big / step)) + 1)
        return [f"{t:.{digits - 1}e}" if t else "0" for t in ticks]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    if any(abs(round(t, decimals) - t) > step * 1e-6 for t in ticks):
        decimals += 1  # a 2.5 step: one more decimal
    return [f"{t:.{decimals}f}" for t in ticks]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.2e}"
    return f"{v:.4g}"


def svg_line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    width: int = 460,
    height: int = 260,
    y_range: tuple[float, float] | None = None,
    chart_id: str | None = None,
    x_label: str = "step",
) -> str:
    """An SVG line chart of ``{label: [(x, y), ...]}`` with axes, ticks, a legend and a tooltip
    (``<title>``) on every point. Returns the ``<svg>`` element as a string."""
    ml, mr, mt, mb = 52, 12, 28, 34
    pw, ph = width - ml - mr, height - mt - mb
    legend_h = 14 * len(series) if len(series) > 1 else 0  # the legend sits below the plot
    height += legend_h
    pts = [p for s in series.values() for p in s]
    id_attr = f' id="{html.escape(chart_id)}"' if chart_id else ""
    parts = [
        f'<svg{id_attr} class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{width / 2:.0f}" y="17" text-anchor="middle" class="ctitle">{html.escape(title)}</text>',
    ]
    if not pts:
        parts.append(
            f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle">no data</text></svg>'
        )
        return "".join(parts)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    xt = nice_ticks(min(xs), max(xs), 6, integer=all(float(x).is_integer() for x in xs))
    lo, hi = min(ys), max(ys)
    if y_range is not None:  # a fixed range, widened if the data leave it
        lo, hi = min(lo, y_range[0]), max(hi, y_range[1])
    yt = nice_ticks(lo, hi, 5)
    ml = max(ml, 6 * max(len(t) for t in tick_labels(yt)) + 10)  # room for the y labels
    pw = width - ml - mr
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def sx(x: float) -> float:
        return ml + (x - x0) / ((x1 - x0) or 1) * pw

    def sy(y: float) -> float:
        return mt + ph - (y - y0) / ((y1 - y0) or 1) * ph

    parts.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" class="plotbg"/>')
    for t, label in zip(yt, tick_labels(yt), strict=True):
        parts.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>')
        parts.append(f'<text x="{ml - 5}" y="{sy(t) + 4:.1f}" text-anchor="end" class="tick">{label}</text>')
    for t, label in zip(xt, tick_labels(xt), strict=True):
        parts.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{mt}" y2="{mt + ph}" class="grid"/>')
        parts.append(
            f'<text x="{sx(t):.1f}" y="{mt + ph + 14}" text-anchor="middle" class="tick">{label}</text>'
        )
    parts.append(
        f'<text x="{ml + pw / 2:.0f}" y="{mt + ph + mb - 4}" text-anchor="middle" class="tick">{html.escape(x_label)}</text>'
    )
    for i, (label, s) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        if not s:
            continue
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        dash = ' stroke-dasharray="5,3"' if label.startswith("eval") else ""
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for x, y in s:
            parts.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
                f"<title>{html.escape(label)}: {html.escape(x_label)} {_fmt(x)} = {y:.4g}</title></circle>"
            )
        if legend_h:  # below the axis label, never over the data
            ly = mt + ph + mb + 10 + 14 * i
            parts.append(f'<rect x="{ml + 8}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
            parts.append(f'<text x="{ml + 22}" y="{ly + 1}" class="legend">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------------------------


def token_pieces(ids: Sequence[int], tokenizer: Any | None) -> list[str]:
    """The text of each token, such that the pieces concatenate to the decoded text where the
    tokenizer allows (byte-level BPE splits multi-byte characters over tokens; such a token shows
    the replacement character). Without a tokenizer, ``⟨id⟩``."""
    if tokenizer is None:
        return [f"⟨{i}⟩" for i in ids]
    ids = list(ids)
    pieces = []
    window = 4
    for k, tid in enumerate(ids):
        s = max(0, k - window)
        prev = tokenizer.decode(ids[s:k], skip_special_tokens=False) if k > s else ""
        cur = tokenizer.decode(ids[s : k + 1], skip_special_tokens=False)
        if cur.startswith(prev) and "\ufffd" not in prev:
            pieces.append(cur[len(prev) :])
        else:
            pieces.append(tokenizer.decode([tid], skip_special_tokens=False))
    return pieces


def advantage_color(adv: float | None, scale: float) -> str:
    """CSS background for an action token: green (A > 0) or red (A < 0), alpha ~ |A| / scale."""
    if adv is None:
        return "rgba(120,120,255,0.18)"
    a = 0.08 + 0.62 * min(1.0, abs(adv) / scale) if scale > 0 else 0.08
    return (
        f"rgba(0,170,60,{a:.3f})"
        if adv > 0
        else f"rgba(220,30,30,{a:.3f})"
        if adv < 0
        else "rgba(0,0,0,0.06)"
    )


def _token_spans(
    ids: Sequence[int],
    pieces: Sequence[str],
    *,
    action: bool,
    adv: float | None,
    logprobs: Sequence[float] | None,
    scale: float,
) -> str:
    out = []
    bg = advantage_color(adv, scale) if action else ""
    for j, (tid, piece) in enumerate(zip(ids, pieces, strict=True)):
        tip = f"id {tid} · mask {1 if action else 0}"
        if action:
            tip += f" · adv {adv:+.3f}" if adv is not None else " · adv n/a"
            if logprobs is not None:
                tip += f" · logprob {logprobs[j]:.3f}"
        style = f' style="background:{bg}"' if action else ""
        cls = "t a" if action else "t c"
        out.append(f'<span class="{cls}" title="{html.escape(tip)}"{style}>{html.escape(piece)}</span>')
    return "".join(out)


def _final_answer(traj: Trajectory) -> str | None:
    msg = traj.final_message
    if msg is None:
        return None
    return extract_answer(msg.content)


ENDED = {
    "finished": "the episode finished (final answer given or the environment ended it)",
    "max_turns": "ran out of turns (rollout.max_turns)",
    "max_tokens": "the last action hit rollout.max_new_tokens before finishing",
    "context_overflow": "the next prompt would not fit rollout.max_context_tokens",
    "error": "the environment or a tool raised",
    "verifier_stop": "the flow agent's verifier judged the memory enough",
}


def ended_text(traj: Trajectory) -> str:
    """Why the episode ended, in words (plus the error message of an ``error`` ending)."""
    value = traj.termination.value
    text = f"{value}: {ENDED.get(value, value)}"
    if value == "error" and traj.metadata.get("error"):
        text += f" ({traj.metadata['error']})"
    return text


def _gold_answers(run: RunDir, env_names: Sequence[str] = ()) -> dict[str, str]:
    """Task id -> gold answer of the run's environment (both splits): the config's, else each
    environment the episodes name (with default arguments); empty when none can be built here (a
    plugin not installed): the report still renders, without gold answers."""
    from flowgrpo.components import env_factory_of
    from flowgrpo.config import EnvConfig

    try:
        envs = [run.config().env]
    except RunError as err:
        log.warning("gold answers from the episodes' environments: %s", str(err).splitlines()[0])
        envs = [EnvConfig(name=n) for n in dict.fromkeys(env_names)]
    golds: dict[str, str] = {}
    for spec in envs:
        try:
            env = env_factory_of(spec)()
            golds |= {t.id: t.answer for split in ("train", "test") for t in env.tasks(split) if t.answer}
        except Exception as err:  # a plugin env not installed here: the report does not need it
            log.warning("gold answers of %r not shown: its environment cannot be built (%s)", spec.name, err)
    return golds


def trajectory_html(
    traj: Trajectory, tokenizer: Any | None, *, scale: float, step: int | None = None, gold: str | None = None
) -> str:
    """One trajectory: a header (reward, breakdown, termination, tokens), every token coloured by
    loss mask and advantage, and the tool calls and observations as messages."""
    e = html.escape
    answer = _final_answer(traj)
    breakdown = ", ".join(f"{e(k)}={v:.3f}" for k, v in sorted(traj.reward_breakdown.items()))
    head = (
        f'<div class="thead"><b>{e(traj.id)}</b> · task <code>{e(traj.task_id)}</code>'
        + (f" · step {step}" if step is not None else "")
        + f' · reward <b class="reward">{traj.reward:.3f}</b>'
        + (f" ({breakdown})" if breakdown else "")
        + f" · {e(traj.termination.value)} · {len(traj.turns)} turns · {traj.num_tokens} tokens "
        f"({traj.num_action_tokens} sampled)</div>"
    )
    rows = []
    for k, turn in enumerate(traj.turns):
        adv_s = f"{turn.advantage:+.3f}" if turn.advantage is not None else "n/a"
        ctx = _token_spans(
            turn.prompt_ids,
            token_pieces(turn.prompt_ids, tokenizer),
            action=False,
            adv=None,
            logprobs=None,
            scale=scale,
        )
        act = _token_spans(
            turn.action_ids,
            token_pieces(turn.action_ids, tokenizer),
            action=True,
            adv=turn.advantage,
            logprobs=turn.action_logprobs,
            scale=scale,
        )
        msgs = []
        for c in turn.action.tool_calls:
            msgs.append(
                f'<div class="call">→ {e(c.name)}({e(json.dumps(c.arguments, ensure_ascii=False))})</div>'
            )
        for m in turn.observations:
            who = f"{m.role}{' ' + m.name if m.name else ''}"
            msgs.append(f'<div class="obs"><b>[{e(who)}]</b> {e(m.content)}</div>')
        rows.append(
            f'<div class="turn"><div class="tmeta">turn {k + 1} · prompt {len(turn.prompt_ids)} tok · action '
            f"{len(turn.action_ids)} tok · reward {turn.reward:+.3f} · advantage {adv_s} · "
            f"{e(turn.finish_reason)}{' · context reset' if turn.resets_context else ''}</div>"
            f'<div class="tokens">{ctx}{act}</div>{"".join(msgs)}'
            + (flow_html(turn.metadata["flow"]) if isinstance(turn.metadata.get("flow"), dict) else "")
            + "</div>"
        )
    gold_html = f' · gold answer: <span class="gold">{e(gold)}</span>' if gold is not None else ""
    ans = (
        f'<div class="final">final answer: <span class="answer">{e(answer)}</span>{gold_html}'
        if answer is not None
        else f'<div class="final">no final answer{gold_html}'
    ) + f' · <span class="ended">ended: {e(ended_text(traj))}</span></div>'
    err = f'<div class="err">{e(str(traj.metadata["error"]))}</div>' if traj.metadata.get("error") else ""
    if isinstance(traj.metadata.get("flow"), dict):
        ans += flow_html(traj.metadata["flow"])
    return f'<section class="traj" data-traj-id="{e(traj.id)}">{head}{err}{"".join(rows)}{ans}</section>'


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------


def _cell(v: Any) -> str:
    if _is_num(v):
        return _fmt(float(v)) if isinstance(v, float) else str(v)
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={_cell(x)}" for k, x in v.items())
    return "" if v is None else str(v)


def records_table(
    records: Sequence[Mapping[str, Any]], *, first: Sequence[str] = ("step",), table_id: str
) -> str:
    """An HTML table of records; columns: ``first`` then the union of keys in first-seen order."""
    if not records:
        return f'<p id="{table_id}" class="empty">none</p>'
    cols: list[str] = [c for c in first if any(c in r for r in records)]
    for r in records:
        cols += [k for k in r if k not in cols]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>"
        + "".join(f'<td data-col="{html.escape(c)}">{html.escape(_cell(r.get(c)))}</td>' for c in cols)
        + "</tr>"
        for r in records
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
#summary{display:flex;gap:14px;flex-wrap:wrap;margin:10px 0}
#summary div{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:120px}
#summary .v{font-size:20px;font-weight:600;display:block}
.charts{display:flex;flex-wrap:wrap;gap:10px}.chart{background:#fff;border:1px solid #ddd;border-radius:6px}
.chart .plotbg{fill:#fff}.chart .grid{stroke:#eee}.chart .tick{font-size:10px;fill:#555}
.chart .ctitle{font-size:13px;font-weight:600}.chart .legend{font-size:11px}
table{border-collapse:collapse;background:#fff;font-size:12px;margin:0}
.scroll{max-height:420px;max-width:100%;overflow:auto;border:1px solid #ddd;margin:6px 0}
.scroll th{position:sticky;top:0}h3{font-size:14px;margin:14px 0 4px;color:#444}
.gold{font-family:ui-monospace,monospace}.ended{color:#555}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}th{background:#f0f0f0}
.traj{background:#fff;border:1px solid #ccc;border-radius:6px;margin:14px 0;padding:10px}
.thead{margin-bottom:6px}.turn{border-top:1px dashed #ddd;padding:6px 0}.tmeta{color:#555;font-size:12px}
.tokens{font:12px/1.7 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-word}
.t{border-radius:2px}.t.c{color:#8a8a8a}.t.a{color:#000;box-shadow:inset 0 -2px 0 #333}
body.mask-only .t.a{background:rgba(255,200,0,.35)!important}
.call{font:12px ui-monospace,monospace;color:#0a6}.obs{font:12px ui-monospace,monospace;color:#864;white-space:pre-wrap}
.final{margin-top:6px}.answer{font-weight:700;font-family:ui-monospace,monospace}.err{color:#c00}
.legend-box span{display:inline-block;padding:1px 6px;margin-right:8px;font:12px ui-monospace,monospace}
pre{background:#fff;border:1px solid #ddd;padding:8px;overflow:auto;font-size:12px}
"""

JS = """
(function(){
  var d = JSON.parse(document.getElementById('run-data').textContent);
  var m = d.metrics, ev = d.evals;
  function set(id, v){ document.getElementById(id).textContent = v; }
  function fx(v){ return (typeof v === 'number' && isFinite(v)) ? v.toFixed(3) : 'n/a'; }
  var last = m.length ? m[m.length - 1] : {};
  set('s-steps', String(m.length));
  set('s-final-step', last.step === undefined ? 'n/a' : String(last.step));
  set('s-reward', fx(last.reward_mean));
  set('s-accuracy', fx(last.accuracy));
  var best = null;
  ev.forEach(function(e){ if (typeof e.accuracy === 'number' && (best === null || e.accuracy > best)) best = e.accuracy; });
  set('s-eval', best === null ? 'n/a' : best.toFixed(3));
  set('s-evals', String(ev.length));
  document.getElementById('summary').setAttribute('data-rendered', 'yes');
  var box = document.getElementById('mask-only');
  if (box) box.addEventListener('change', function(){ document.body.classList.toggle('mask-only', box.checked); });
})();
"""


def _json_for_script(obj: Any) -> str:
    """JSON safe inside ``<script>``: ``<``, ``>`` and ``&`` as unicode escapes, so no string in
    the data can close the element."""
    s = json.dumps(obj, allow_nan=False, default=str)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _clean(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Records with non-finite floats as None (JSON has no NaN)."""

    def fix(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, Mapping):
            return {str(k): fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return [fix(dict(r)) for r in records]


def _pick_trajectories(
    run: RunDir, steps: Sequence[int] | None, max_trajectories: int
) -> list[tuple[int, Trajectory]]:
    avail = run.steps()
    if not avail or max_trajectories <= 0:
        return []
    if steps:
        missing = [s for s in steps if s not in avail]
        if missing:
            raise RunError(f"no trajectories saved for steps {missing}; saved: {avail[0]}..{avail[-1]}")
        chosen = list(dict.fromkeys(steps))
    else:
        chosen = list(dict.fromkeys([avail[0], avail[-1]]))
    per = max(1, math.ceil(max_trajectories / len(chosen)))
    out: list[tuple[int, Trajectory]] = []
    for s in chosen:
        out += [(s, t) for t in run.trajectories(s)[:per]]
    return out[:max_trajectories]


def render_report(
    run: RunDir,
    *,
    tokenizer: Any | None = None,
    max_trajectories: int = 8,
    steps: Sequence[int] | None = None,
) -> str:
    """The report page of ``run`` as an HTML string."""
    e = html.escape
    # per-task outcomes serve paired comparisons (`flowgrpo eval --compare`), not the page
    recorded = run.evals()
    rows = _clean(_metric_rows(run.metrics()))
    metrics = [r for r in rows if not is_warm_start_row(r)]  # RL steps only: the step axis and count
    warm = [r for r in rows if is_warm_start_row(r)]
    evals = _clean([e.model_dump(mode="json", exclude={"per_task"}) for e in recorded])
    charts = [
        svg_line_chart(
            {"train": _series(metrics, "reward_mean")}, title="mean reward", chart_id="chart-reward"
        ),
        svg_line_chart(
            {
                "train": _series(metrics, "accuracy"),
                **{f"eval ({k})": v for k, v in sorted(_eval_series(recorded).items())},
            },
            title="accuracy",
            chart_id="chart-accuracy",
            y_range=(0.0, 1.0),
        ),
    ]
    sections = [
        (title, [k for k in keys if k not in ("reward_mean", "accuracy") and _series(metrics, k)])
        for title, keys in metric_order([k for r in metrics for k in r])
    ]
    small = "".join(
        f'<h3>{html.escape(title)}</h3><div class="charts">'
        + "".join(
            svg_line_chart({k: _series(metrics, k)}, title=METRIC_TITLES.get(k, k), width=300, height=190)
            for k in keys
        )
        + "</div>"
        for title, keys in sections
        if keys
    )
    if warm:
        epochs = [
            (float(r.get("sft/epoch", i)) + 1, r["sft/loss"]) for i, r in enumerate(warm) if "sft/loss" in r
        ]
        small += (
            '<h3>warm start (per epoch, before RL)</h3><div class="charts">'
            + svg_line_chart(
                {"sft loss": epochs},
                title="supervised loss per epoch",
                width=300,
                height=190,
                x_label="epoch",
            )
            + "</div>"
        )
    table_cols = ["step", *(k for _, keys in metric_order([k for r in metrics for k in r]) for k in keys)]

    picked = _pick_trajectories(run, steps, max_trajectories)
    golds = _gold_answers(run, [t.env for _, t in picked])
    advs = [abs(u.advantage) for _, t in picked for u in t.turns if u.advantage is not None]
    scale = max(advs) if advs else 1.0
    trajs_html = "".join(
        trajectory_html(t, tokenizer, scale=scale, step=s, gold=golds.get(t.task_id)) for s, t in picked
    )
    n_saved = len(run.steps())
    tok_note = (
        "tokens shown as text (the run's tokenizer)"
        if tokenizer is not None
        else "tokens shown as ids: the run's tokenizer could not be loaded"
    )
    config_text = _config_text(run)
    summary = "".join(
        f'<div>{label}<span class="v" id="{i}">…</span></div>'
        for i, label in (
            ("s-steps", "steps logged"),
            ("s-final-step", "last step"),
            ("s-reward", "final mean reward"),
            ("s-accuracy", "final accuracy"),
            ("s-eval", "best eval accuracy"),
            ("s-evals", "evaluations"),
        )
    )
    data = _json_for_script({"metrics": metrics, "evals": evals})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>flowgrpo report: {e(run.name)}</title><style>{CSS}</style></head>
<body><main>
<h1>flowgrpo run <code>{e(run.name)}</code></h1>
<div class="path">{e(str(run.path))}</div>
<div id="summary" data-rendered="no">{summary}</div>
<h2>Curves</h2><div class="charts">{"".join(charts)}</div>
{small}
<h2>Per-step metrics</h2><div class="scroll">{records_table(metrics, first=table_cols, table_id="metrics-table")}</div>
<h2>Evaluations</h2><div class="scroll">{records_table(evals, first=("step", "split", "label", "n", "accuracy", "ci95"), table_id="eval-table")}</div>
<h2>Trajectories</h2>
<p>{len(picked)} trajectories shown from steps {", ".join(str(s) for s in dict.fromkeys(s for s, _ in picked)) or "(none)"}
of {n_saved} saved; {e(tok_note)}. Hover a token for its id, mask, advantage and logprob.</p>
<div class="legend-box"><span class="t c">prompt / observation (mask 0)</span><span class="t a"
style="background:{advantage_color(scale, scale)}">action, A &gt; 0</span><span class="t a"
style="background:{advantage_color(-scale, scale)}">action, A &lt; 0</span>
<label><input type="checkbox" id="mask-only"> colour by loss mask only</label></div>
<div id="trajectories">{trajs_html}</div>
<h2>Config</h2><pre id="config">{e(config_text)}</pre>
</main>
<script type="application/json" id="run-data">{data}</script>
<script>{JS}</script>
</body></html>
"""


def _config_text(run: RunDir) -> str:
    """The run's config as YAML; the reason instead when it has none or it does not validate (the
    rest of the page does not need it)."""
    if not run.has_config():
        return "(no config.yaml)"
    try:
        cfg = run.config()
    except RunError as err:
        return f"(config.yaml could not be read: {err})"
    import yaml

    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, default_flow_style=False)


def build_report(
    run_dir: str | os.PathLike,
    *,
    output: str | os.PathLike | None = None,
    max_trajectories: int = 8,
    steps: Sequence[int] | None = None,
    tokenizer: Any | str | None = "auto",
) -> Path:
    """Write the HTML report (default ``RUN/report.html``) and return its path.

    ``tokenizer="auto"`` loads the run's tokenizer from its config (offline; token ids are shown
    when that fails), None shows ids, or pass a tokenizer object.
    """
    run = RunDir(run_dir)
    if isinstance(tokenizer, str):
        if tokenizer != "auto":
            raise ValueError(f"tokenizer must be 'auto', None or a tokenizer object, got {tokenizer!r}")
        tokenizer = load_tokenizer_for_run(run)
    page = render_report(run, tokenizer=tokenizer, max_trajectories=max_trajectories, steps=steps)
    out = Path(output) if output is not None else run.path / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out


def cli_report(args: Any) -> int:
    """``flowgrpo report``: writes the page (and plot.png unless --no-plot); exit 2 on a bad run."""
    import sys

    try:
        out = build_report(
            args.run,
            output=args.output,
            max_trajectories=args.max_trajectories,
            steps=args.step,
            tokenizer=None if args.no_tokenizer else "auto",
        )
        print(f"wrote {out}")
        if not args.no_plot:
            print(f"wrote {plot_run(args.run)}")
    except RunError as e:
        print(f"flowgrpo report: error: {e}", file=sys.stderr)
        return 2
    return 0


__all__ = [
    "advantage_color",
    "build_report",
    "cli_report",
    "nice_ticks",
    "plot_run",
    "records_table",
    "render_report",
    "svg_line_chart",
    "token_pieces",
    "trajectory_html",
]
