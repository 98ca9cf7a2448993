"""flowgrpo.runs.records: a resumed run's later records are moved aside, never duplicated or deleted."""

from __future__ import annotations

import json

from flowgrpo.runs.records import rewind_records


def _write(path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


def test_records_after_the_resume_step_move_aside(tmp_path):
    run = tmp_path / "RUN"
    for step in (1, 2, 3, 4):
        _write(run / "trajectories" / f"step_{step:06d}.jsonl", [json.dumps({"step": step})])
    metrics = [json.dumps({"step": s, "reward_mean": s / 10}) for s in (1, 2, 3, 4)]
    _write(run / "metrics.jsonl", [metrics[0], metrics[1], '{"step": 3, "rew', metrics[2], metrics[3]])
    evals = [json.dumps({"step": 2, "label": "step2"}), json.dumps({"step": 4, "label": "step4"})]
    _write(run / "eval.jsonl", evals)
    _write(run / "eval" / "step2.jsonl", ["{}"])
    _write(run / "eval" / "step4.jsonl", ["{}"])

    done = rewind_records(run, 2)

    assert sorted(p.name for p in (run / "trajectories").iterdir()) == [
        "step_000001.jsonl",
        "step_000002.jsonl",
    ]
    assert (run / "metrics.jsonl").read_text().splitlines() == metrics[:2]
    assert (run / "eval.jsonl").read_text().splitlines() == evals[:1]
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["step2.jsonl"]
    aside = done.folder
    assert aside.parent == run / "superseded"
    assert sorted(p.name for p in (aside / "trajectories").iterdir()) == [
        "step_000003.jsonl",
        "step_000004.jsonl",
    ]
    assert (aside / "metrics.jsonl").read_text().splitlines() == ['{"step": 3, "rew', metrics[2], metrics[3]]
    assert (aside / "eval.jsonl").read_text().splitlines() == evals[1:]
    assert (aside / "eval" / "step4.jsonl").is_file()
    assert (done.metric_lines, done.torn_lines, done.eval_lines) == (2, 1, 1)
    assert done.describe(2).startswith(f"resuming at step 2: moved the records of later steps to {aside} (2 ")
    # idempotent: nothing left to move
    again = rewind_records(run, 2)
    assert not again.moved and again.folder is None and "no records of later steps" in again.describe(2)
