"""Smoke tests of the benchmark scripts' core functions with tiny models.

No timing is ever asserted (the machine is shared and noisy); these check that each script's
measurement path runs end to end and that the counts it reports are right.
"""

from __future__ import annotations

import sys

import pytest

from benchmarks._common import child_env, median, run_child
from benchmarks.prefix_merging import layout_costs
from benchmarks.update_mfu import ModelShape, action_mask_row, measure, train_flops


def test_run_child_reports_that_childs_own_peak_rss() -> None:
    small = run_child("benchmarks._common", ["--alloc-mb", "0"], env=child_env())
    big = run_child("benchmarks._common", ["--alloc-mb", "300"], env=child_env())
    assert big.payload["allocated_mb"] == 300
    # 300 MB touched in the child shows in its ru_maxrss; the small child does not inherit it.
    assert big.peak_rss_bytes - small.peak_rss_bytes > 200 * 1024 * 1024
    assert small.peak_rss_bytes < 200 * 1024 * 1024


def test_run_child_failure_says_what_failed() -> None:
    with pytest.raises(RuntimeError, match="exit code"):
        run_child("benchmarks._common", ["--alloc-mb", "not-a-number"], env=child_env())


def test_median_of_even_and_odd_lists() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_train_flops_by_hand() -> None:
    shape = ModelShape(layers=2, hidden=4, attn_dim=4, vocab=10, linear_params=100)
    # dense 6*100*3 = 1800; causal attention 6*2*4*3*4 = 576; head 6*4*10*2 = 480
    assert train_flops(shape, 3, 2) == 1800 + 576 + 480
    # PaLM's full square: 12*2*4*3*3 = 864
    assert train_flops(shape, 3, 2, causal=False) == 1800 + 864 + 480


def test_model_shape_counts_smollm2_like_linear_weights() -> None:
    from flowgrpo.modeling.models import tiny_model

    model, _ = tiny_model(hidden_size=64, num_layers=2, num_heads=4)
    shape = ModelShape.of(model)
    # per layer: q, k, v, o 64x64 each + gate, up, down 64x128 each
    assert shape.linear_params == 2 * (4 * 64 * 64 + 3 * 64 * 128)
    assert (shape.layers, shape.hidden, shape.attn_dim) == (2, 64, 64)


def test_action_mask_row_layout() -> None:
    m = action_mask_row(260)
    assert (
        m[:150] == [0] * 150 and m[150:190] == [1] * 40 and m[190:210] == [0] * 20 and m[210:250] == [1] * 40
    )
    assert len(m) == 260 and sum(m) == 80 and m[250:] == [0] * 10
    short = action_mask_row(128)  # shorter than prompt + action: the prompt shrinks, one action fits
    assert short[:88] == [0] * 88 and short[88:] == [1] * 40


def test_update_mfu_measure_runs_on_a_tiny_model() -> None:
    r = measure(
        "smoke", model_name="tiny", weights="fp32", T=256, tokens=256, reps=1, peak={"fp32": 1e9, "bf16": 1e9}
    )
    assert r.rows == 1 and r.T == 256
    assert r.fwd_bwd_s > 0 and r.tflops > 0 and r.mfu > 0


def test_prefix_merging_token_counts_by_hand() -> None:
    c = layout_costs(4, group=2)
    # packed: 150 + 4*40 + 3*20 = 370 per episode
    assert c["packed"]["tokens"] == 2 * 370 and c["packed"]["rows"] == 2
    # per turn: contexts 150, 210, 270, 330 plus a 40-token action each = 1120 per episode
    assert c["per_turn"]["tokens"] == 2 * 1120 and c["per_turn"]["rows"] == 8
    assert c["token_ratio"] == pytest.approx(1120 / 370)
    assert c["packed"]["action_tokens"] == c["per_turn"]["action_tokens"] == 2 * 160
    assert 1.0 < c["flop_ratio"] < c["token_ratio"]


def test_flowgrpo_side_one_trainer_step_on_a_tiny_model(tmp_path) -> None:
    from benchmarks._common import load_policy
    from benchmarks.vs_trl import BenchConfig, FlowGRPOSide, bench_tasks

    cfg = BenchConfig(model="tiny", max_completion_tokens=8)
    model, tok = load_policy("tiny")
    tasks = bench_tasks(4)
    side = FlowGRPOSide(model, tok, cfg, tasks, str(tmp_path))
    s = side.step(0)
    assert s.rows == cfg.num_completions  # every group is trained on, as in TRL
    assert 0 < s.completion_tokens <= cfg.num_completions * 8
    assert s.train_tokens == s.completion_tokens
    assert set(s.phases) == {"rollout", "update", "other"}
    # the fixed task order both sides share: step 0 = tasks 0 and 1
    trajs = (tmp_path / "trajectories" / "step_000001.jsonl").read_text()
    assert tasks[0].id in trajs and tasks[1].id in trajs and tasks[2].id not in trajs


@pytest.mark.slow
def test_trl_and_flowgrpo_children_multi_turn_tiny() -> None:
    """Both sides of vs_trl in their own subprocesses, multi-turn, on the tiny model (~2 min)."""
    for side in ("trl", "flowgrpo"):
        r = run_child(
            "benchmarks.vs_trl",
            ["--task", "multi", "--precision", "bf16", "--model", "tiny", "--steps", "1", "--side", side],
            env=child_env(),
        )
        assert len(r.payload["step_s"]) == 1 and r.payload["completion_tokens"][0] > 0
        assert r.peak_rss_bytes > 0


def test_rollout_benchmark_runs_every_side_on_a_tiny_model(capsys) -> None:
    from benchmarks import rollout
    from flowgrpo.modeling.models import tiny_model

    model, tok = tiny_model()
    rollout.bench_single(model, tok, n=3, new=5, reps=1)
    rollout.bench_multi(
        model, tok, n=4, group=2, new=4, turns=2, sleep_s=0.01, bs=4, agent=True, jitter_s=0.005
    )
    out = capsys.readouterr().out
    assert "engine" in out and "generate" in out and "x turns/s" in out
    multi = out.split("== multi-turn")[1].splitlines()
    for side in ("engine:", "engine/lockstep:", "waves/generate:"):
        line = next(ln for ln in multi if ln.strip().startswith(side))
        turns = int(line.split(":")[1].split()[0])
        assert 2 <= turns <= 4 * 2  # every episode took at least its first turn, at most 2


def test_rollout_benchmark_prints_every_precision_mode_side_by_side(capsys) -> None:
    import torch

    from benchmarks import rollout
    from flowgrpo.modeling.models import tiny_model

    model, tok = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = list(rollout.PRECISIONS)
    rollout.bench_precision(model, tok, n=2, new=3, reps=1, modes=modes, update_rows=2, update_len=16)
    out = capsys.readouterr().out
    for m in modes:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(m + " "))
        assert len(line.split()) == 7, line
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # weights restored


def test_by_task_splits_recorded_evaluations_by_a_task_field(tmp_path, capsys) -> None:
    from benchmarks.by_task import main
    from flowgrpo.components import env_factory_of
    from flowgrpo.config import dump_config, load_config
    from flowgrpo.runs.store import append_line, encode_record
    from flowgrpo.types import Message, Trajectory, Turn

    cfg = load_config(None, ["env.name=multihop", f"run.output_dir={tmp_path}"])
    dump_config(cfg, tmp_path / "config.yaml")
    tasks = env_factory_of(cfg.env)().tasks("test")
    one = [t for t in tasks if t.metadata["hops"] == 1][:2]
    two = [t for t in tasks if t.metadata["hops"] == 2][:1]
    turn = Turn(
        prompt_ids=[1], action_ids=[2], action_logprobs=[0.0], action=Message(role="assistant", content="x")
    )
    trajs = [
        Trajectory(task_id=t.id, turns=[turn] * k, reward_breakdown={"accuracy": acc})
        for t, k, acc in [(one[0], 2, 1.0), (one[1], 2, 0.0), (two[0], 3, 1.0)]
    ]
    (tmp_path / "eval").mkdir()
    for t in trajs:
        append_line(tmp_path / "eval" / "warm.jsonl", encode_record(t))
    assert main([str(tmp_path), "warm", "--key", "hops"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[2].startswith("| 1 | 1 / 2 [") and rows[2].endswith(", 2.00 |")
    assert rows[3].startswith("| 2 | 1 / 1 [") and rows[3].endswith(", 3.00 |")
    assert main([str(tmp_path), "warm", "--key", "chain"]) == 0  # a list: one row per relation chain
    rows = capsys.readouterr().out.splitlines()
    chains = {" > ".join(t.metadata["chain"]) for t in one + two}
    assert {r.split(" | ")[0].removeprefix("| ") for r in rows[2:]} == chains
    assert any(" > " in c for c in chains)
    for t, acc in [(one[0], 1.0), (one[1], 1.0), (two[0], 0.0)]:  # step3: 1-hop 1 -> 2 of 2, 2-hop 1 -> 0
        append_line(
            tmp_path / "eval" / "step3.jsonl",
            encode_record(Trajectory(task_id=t.id, turns=[turn] * 2, reward_breakdown={"accuracy": acc})),
        )
    assert main([str(tmp_path), "warm", "step3", "--key", "hops", "--paired"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].endswith(" | step3 - warm, paired [95% CI], p |") and rows[1] == "|---|---|---|---|"
    assert rows[2].split(" | ")[-1].startswith("+50.0 [") and rows[2].endswith(
        "], p = 1 (n = 2; 1 fixed, 0 broken; 2x2 1,0,1,0) |"
    )
    assert rows[3].split(" | ")[-1].startswith("-100.0 [") and rows[3].endswith(
        "], p = 1 (n = 1; 0 fixed, 1 broken; 2x2 0,1,0,0) |"
    )
    with pytest.raises(SystemExit):
        main([str(tmp_path), "warm", "--key", "hops", "--paired"])  # one label: nothing to pair
    (tmp_path / "trajectories").mkdir()  # the same episodes as step 4's sampled batch: 2 + 1 tasks
    for t in trajs:
        append_line(tmp_path / "trajectories" / "step_000004.jsonl", encode_record(t))
    assert main([str(tmp_path), "--steps", "4", "--key", "hops"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "| hops | step 4 (sampled): correct / n [95% CI], turns (tasks) |"
    assert rows[2].startswith("| 1 | 1 / 2 [") and rows[2].endswith(", 2.00 (2 tasks) |")
    assert rows[3].endswith(", 3.00 (1 task) |")
    with pytest.raises(SystemExit):
        main([str(tmp_path), "warm", "--steps", "4", "--key", "hops"])
    with pytest.raises(SystemExit):
        main([str(tmp_path), "warm", "--key", "hops", "--decision", "2"])  # evaluations carry no advantages

    # --decision 2: the second turn split into tool calls and the rest, with their mean advantages
    call = Message(
        role="assistant", content="c", tool_calls=[{"id": "c1", "name": "search", "arguments": {}}]
    )
    answer = Message(role="assistant", content="<answer>x</answer>")
    step = []
    for t, second, adv in [
        (one[0], call, -1.0),
        (one[0], answer, 0.5),
        (one[1], answer, 1.5),
        (two[0], call, 2.0),
    ]:
        turns = [
            turn.model_copy(update={"advantage": adv}),
            turn.model_copy(update={"action": second, "advantage": adv}),
        ]
        step.append(Trajectory(task_id=t.id, turns=turns, reward_breakdown={"accuracy": 1.0}))
    step.append(
        Trajectory(task_id=one[1].id, turns=[turn.model_copy(update={"advantage": 9.0})])
    )  # stopped at turn 1
    for t in step:
        append_line(tmp_path / "trajectories" / "step_000005.jsonl", encode_record(t))
    assert main([str(tmp_path), "--steps", "5", "--key", "hops", "--decision", "2"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[-3:] == [
        "|---|---|",
        "| 1 | 1 (-1.00) / 2 (+1.00), push -1.00 |",
        "| 2 | 1 (+2.00) / 0, push +2.00 |",
    ]


def test_sweep_tabulates_arms_and_plots_one_panel_per_warm_start(tmp_path, capsys) -> None:
    import json

    from benchmarks.sweep import main
    from flowgrpo.config import dump_config, load_config
    from flowgrpo.runs.evaluation import EvalResult

    def arm(name: str, overrides: list[str], warm: float, after: float, p: float, solved: list[int]) -> None:
        record = {
            "name": name,
            "config": "examples/calculator_agent.yaml",
            "overrides": overrides,
            "control": "rl",
            "steps": 5,
            "train_min": 8.9,
            "step_s": [90.0, 100.0, 120.0],
            "peak_rss_mb": 10_650.0,
            "curve": [
                {"step": 0, "train_min": 0.0, "accuracy": warm, "ci95": [warm - 0.07, warm + 0.07]},
                {"step": 5, "train_min": 8.9, "accuracy": after, "ci95": [after - 0.07, after + 0.07]},
            ],
            "final": {"accuracy": after, "ci95": [after - 0.07, after + 0.07], "n": 200},
            "vs_warm": {"n": 200, "accuracy_a": warm, "accuracy_b": after, "only_a": 27, "only_b": 36,
                        "difference": after - warm, "ci95": [-0.033, 0.122], "p_value": p},
        }  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "arm.json").write_text(json.dumps(record))
        dump_config(load_config(record["config"], overrides), tmp_path / name / "config.yaml")
        final = EvalResult(
            label="step5", step=5, n=len(solved), accuracy=after, ci95=(0.0, 1.0),
            per_task={f"t{i}": c for i, c in enumerate(solved)},
        )  # fmt: skip
        (tmp_path / name / "eval.jsonl").write_text(final.model_dump_json() + "\n")

    arm("base", [], 0.565, 0.61, 0.3135, [1, 0, 1, 0])
    arm("hard", ["env.kwargs.difficulty=2"], 0.2, 0.3, 0.004, [0, 0, 0, 0])
    arm("lr", ["train.lr=3e-5"], 0.565, 0.62, 0.2, [1, 1, 1, 1])
    arm("small", ["sft.tasks=32"], 0.325, 0.42, 0.02, [1, 0, 0, 0])
    pytest.importorskip("matplotlib")
    assert main(["--root", str(tmp_path), "--plot", str(tmp_path / "sweep.png"), "--versus", "base"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].endswith("| vs base [95% CI], p |")
    base, hard, lr, small = (r.split(" | ") for r in rows[2:6])
    assert base[1:] == ["(recipe)", base[2], "5 (8.9)", "100", "0.610 [0.540, 0.680]",
                        "+4.5 [-3.3, +12.2], p = 0.31", "10.4", "- |"]  # fmt: skip
    assert base[2].endswith(": 0.565") and hard[2].endswith(": 0.200")
    assert base[2][:6] == lr[2][:6] != hard[2][:6]  # another environment: another warm start
    assert small[2][:6] not in (base[2][:6], hard[2][:6])  # another sft section: another warm start
    assert hard[-1] == "(other tasks) |"  # level 2's problems under the same task ids: no pairing
    assert small[-1].startswith("-25.0 [")  # other weights, same tasks: paired
    assert lr[-1].startswith("+50.0 [") and lr[-1].endswith("p = 0.5 |")  # 2 tasks fixed, 0 broken
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="does not exist"):
        main(["--root", str(tmp_path), "missing"])


def test_learning_matrix_records_an_arms_own_peak_memory(tmp_path) -> None:
    import sys

    from benchmarks.learning_matrix import run_logged

    grow = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('done')"
    rc, wall_min, peak_gb = run_logged([sys.executable, "-c", grow], tmp_path / "log")
    assert rc == 0 and (tmp_path / "log").read_text() == "done\n"
    assert 0.3 < peak_gb < 2.0 and 0 < wall_min < 1  # the child's 300 MiB, not the test process's
    rc, _, _ = run_logged([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "log")
    assert rc == 3


def test_learning_matrix_stops_an_arm_with_sigterm_at_its_deadline(tmp_path) -> None:
    """``--stop-after``: an arm still running at the deadline gets SIGTERM (a training run then
    checkpoints and evaluates), and one that ends before it runs to its end."""
    import sys
    import time

    from benchmarks.learning_matrix import run_logged

    child = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('stopped at its step'), sys.exit(0)))\n"
        "time.sleep(120)\n"
        "print('ran to the end')\n"
    )
    rc, wall_min, _ = run_logged(
        [sys.executable, "-c", child], tmp_path / "log", stop_at=time.monotonic() + 3
    )
    assert rc == 0 and (tmp_path / "log").read_text() == "stopped at its step\n"
    assert wall_min < 1  # stopped, not slept out
    rc, _, _ = run_logged(
        [sys.executable, "-c", "print('done')"], tmp_path / "log", stop_at=time.monotonic() + 1
    )
    assert rc == 0 and (tmp_path / "log").read_text() == "done\n"


def test_learning_matrix_a_resumed_arm_keeps_its_earlier_log_and_cost(tmp_path) -> None:
    import json
    import sys

    from benchmarks.learning_matrix import record_cost, run_logged

    log, wall = tmp_path / "train.log", tmp_path / "wall.json"
    run_logged([sys.executable, "-c", "print('steps 1-13')"], log)
    record_cost(wall, -9, 7.75, 2.7, resume=False)  # killed during its final evaluation
    run_logged([sys.executable, "-c", "print('step 15, final')"], log, append=True)
    record_cost(wall, 0, 1.0, 3.2, resume=True)
    assert log.read_text() == "steps 1-13\nstep 15, final\n"
    assert json.loads(wall.read_text()) == {"rc": 0, "wall_min": 8.75, "peak_rss_gb": 3.2, "runs": 2}
    record_cost(wall, 0, 5.0, 1.0, resume=False)  # a fresh run of the arm starts the count again
    assert json.loads(wall.read_text()) == {"rc": 0, "wall_min": 5.0, "peak_rss_gb": 1.0, "runs": 1}


def test_learning_matrix_reads_run_resume_as_the_trainer_does() -> None:
    from benchmarks.learning_matrix import resumes

    assert resumes(["train.lr=1e-5", "run.resume=true"])
    assert resumes(["run.resume=True"]) and resumes(["run.resume = yes"])
    assert resumes(["run.resume=/runs/arm/checkpoints/step_000004"])
    assert not resumes(["train.lr=1e-5"])
    assert not resumes(["run.resume=true", "run.resume=false"])  # the last one wins, as in the config


def test_learning_matrix_pairs_each_arm_with_its_own_warm_start_and_pools(
    tmp_path, capsys, monkeypatch
) -> None:
    import json
    import time

    from benchmarks.learning_matrix import main
    from flowgrpo.runs.evaluation import EvalResult

    def arm(
        name: str, warm: list[int], final: list[int], curve: list[int] | None = None, final_step: int = 3
    ) -> None:
        out = tmp_path / "calculator_agent" / name
        out.mkdir(parents=True, exist_ok=True)
        evals = [("warm", 0, warm)] + ([("step2", 2, curve)] if curve else [])
        evals.append((f"step{final_step}", final_step, final))
        with open(out / "eval.jsonl", "w") as f:
            for label, step, solved in evals:
                ev = EvalResult(
                    label=label, step=step, n=len(solved), accuracy=sum(solved) / len(solved),
                    ci95=(0.0, 1.0), per_task={f"t{i}": c for i, c in enumerate(solved)},
                )  # fmt: skip
                f.write(ev.model_dump_json() + "\n")
        (out / "machine.json").write_text(json.dumps({"cores": 2, "cpu_flags": ["avx2", "avx512_bf16"]}))

    # seed 0: 3 tasks fixed, 1 broken; seed 1: 2 fixed, 0 broken (its curve: a 2-task evaluation)
    arm("fp32-seed0", [1, 0, 0, 0, 1, 1], [1, 1, 1, 1, 0, 1])
    arm("fp32-seed1", [0, 0, 1, 1], [1, 1, 1, 1], curve=[1, 0])
    (tmp_path / "calculator_agent" / "fp32-seed1" / "wall.json").write_text(
        json.dumps({"rc": 0, "wall_min": 46.6, "peak_rss_gb": 17.34})
    )
    rc = main(
        ["--config", "examples/calculator_agent.yaml", "--seeds", "0", "1", "2", "--root", str(tmp_path)]
    )
    assert rc == 0
    out = capsys.readouterr().out
    rows = {r.split(" | ")[0].lstrip("| "): r.split(" | ") for r in out.splitlines() if r.startswith("| ")}
    s0, s1 = rows["fp32-seed0"], rows["fp32-seed1"]
    assert s0[1:4] == ["2-core CPU (avx512_bf16)", "0.500", "0.833"]
    assert s0[4].startswith("+33.3 [") and s0[5] == "0.62"  # McNemar 3 vs 1: p = 2 * 5/16
    assert s1[4].startswith("+50.0 [") and s1[5] == "0.5" and s1[6] == "0.50 (n=2)"
    assert s1[7] == "47 min, peak 17.3 GB |" and s0[7] == "- |"
    pooled = rows["**pooled** (2 arms, n=10)"]
    assert (
        pooled[1:4] == ["2-core CPU (avx512_bf16)", "0.500", "0.900"] and pooled[5] == "0.22"
    )  # 5 fixed vs 1 broken: p = 2 * 7/64 = 0.22
    assert "not run yet: fp32-seed2 (add --run)" in out
    assert "python -m benchmarks.pool_tables --arm fp32-seed0=2,1,3,0 --arm fp32-seed1=2,0,2,0" in out

    # --per-step: the RL steps of an arm's metrics.jsonl, one entry per step; an arm without one is left out
    step = {"episodes": 64, "loss": 0.1, "sampler_ratio_min": 0.5, "sampler_ratio_max": 1.25, "entropy": 0.04}
    step |= {
        "groups_trained": 6,
        "groups_sampled": 9,
        "kl": -1e-5,
        "time/rollout_s": 12.4,
        "time/update_s": 3.6,
    }
    lines = [{"step": 0, "sft/loss": 0.5}, step | {"step": 1}, {"step": 1, "eval/accuracy": 0.6}]
    lines.append(step | {"step": 2, "kl": 0.021, "groups_trained": 4})
    (tmp_path / "calculator_agent" / "fp32-seed0" / "metrics.jsonl").write_text(
        "\n".join(json.dumps(x) for x in lines)
    )
    main(["--seeds", "0", "1", "--root", str(tmp_path), "--per-step"])
    out = capsys.readouterr().out
    assert (
        "| fp32-seed0 | 0.50-1.25, 0.50-1.25 | 0.040, 0.040 | 6/9, 4/9 | 0.000, 0.021 | 12+4 s, 12+4 s |"
        in out
    )
    assert "| fp32-seed1 | 0.50" not in out and out.count("| fp32-seed1 |") == 1

    # --steps: the longer arm is also paired with its config-length run, final against final
    arm("fp32-seed0-steps15", [1, 0, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1], final_step=15)
    assert main(["--seeds", "0", "--steps", "15", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    vs = out.split("against the config's own run")[1]
    row = next(r for r in vs.splitlines() if r.startswith("| fp32-seed0-steps15")).split(" | ")
    assert row[1:4] == ["0.833 (step 3)", "1.000 (step 15)", row[3]] and row[3].startswith("+16.7 [")
    assert row[4:] == ["1", "6/6 |"]  # one task fixed, none broken: p = 1; the warm starts agree on all 6

    # --versus-step: each arm's end against its own evaluation at that step, per arm and pooled; the
    # peak is the curve's best evaluation of the final's n
    arm("fp32-seed0-steps15", [1, 0, 0, 0, 1, 1], [1, 1, 1, 1, 0, 1], curve=[1, 1, 1, 1, 1, 1], final_step=15)
    arm("fp32-seed1-steps15", [0, 0, 1, 1], [1, 1, 1, 1], curve=[0, 1, 1, 1], final_step=15)
    argv = ["--seeds", "0", "1", "2", "--steps", "15", "--root", str(tmp_path), "--versus-step", "2"]
    assert main(argv) == 0
    vs = capsys.readouterr().out.split("against each arm's own step 2, same tasks")[1]
    rows = {r.split(" | ")[0].lstrip("| "): r.split(" | ") for r in vs.splitlines() if r.startswith("| ")}
    s0, s1 = rows["fp32-seed0-steps15"], rows["fp32-seed1-steps15"]
    assert s0[1:3] == ["1.000", "0.833 (step 15)"] and s0[3].startswith("-16.7 [") and s0[4] == "1"
    assert s0[5:] == ["1.000 (step 2)", "-16.7 |"]  # one broken, none fixed: exact McNemar p = 1
    assert s1[1:3] == ["0.750", "1.000 (step 15)"] and s1[5:] == ["1.000 (step 15)", "+0.0 |"]
    pooled = rows["**pooled** (2 arms, n=10)"]
    assert pooled[1:3] == ["0.900", "0.900"] and pooled[3].startswith("+0.0 [") and pooled[4] == "1"
    assert "fp32-seed2-steps15" not in rows
    assert main([*argv[:-1], "7"]) == 0
    assert "no arm has an evaluation at step 7 before its final" in capsys.readouterr().out
    # a curve narrower than the final (the first run.eval_n tasks) pairs on the tasks both evaluated
    arm("fp32-seed2-steps15", [0, 0, 0, 0], [1, 0, 1, 1], curve=[1, 1], final_step=15)
    assert main(argv) == 0
    vs = capsys.readouterr().out.split("against each arm's own step 2, same tasks")[1]
    rows = {r.split(" | ")[0].lstrip("| "): r.split(" | ") for r in vs.splitlines() if r.startswith("| ")}
    s2 = rows["fp32-seed2-steps15"]
    assert s2[1:3] == ["1.000 (n=2)", "0.500 (step 15)"] and s2[3].startswith("-50.0 [") and s2[4] == "1"
    assert s2[5:] == ["1.000 (step 2)", "-50.0 |"]  # the peak and the final on the same two tasks
    assert "**pooled** (3 arms, n=12)" in rows

    # --label: a recipe variant's arm has a name of its own and is paired with the config's run
    arm("fp32-seed0-steps15-anchored", [1, 0, 0, 0, 1, 1], [0, 1, 1, 0, 0, 0], final_step=15)
    assert main(["--seeds", "0", "--steps", "15", "--label", "anchored", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| fp32-seed0-steps15-anchored |" in out and "| fp32-seed0-steps15 |" not in out
    vs = out.split("the 15-step anchored arms against the config's own run")[1]
    row = next(r for r in vs.splitlines() if r.startswith("| fp32-seed0-steps15-anchored")).split(" | ")
    assert row[1:3] == ["0.833 (step 3)", "0.333 (step 15)"] and row[3].startswith("-50.0 [")
    assert row[4:] == ["0.25", "6/6 |"]  # three tasks broken, none fixed: exact McNemar p = 2 / 8
    # ... and with the config's own run of the same length, the control for its overrides
    vs = out.split("the 15-step anchored arms against the config's own 15-step run")[1]
    row = next(r for r in vs.splitlines() if r.startswith("| fp32-seed0-steps15-anchored")).split(" | ")
    assert row[1:3] == ["0.833 (step 15)", "0.333 (step 15)"] and row[3].startswith("-50.0 [")
    assert row[4:] == ["0.25", "6/6 |"]
    # two seeds: the control comparison gets a pooled test over both arms' pairs; this seed's warm
    # start differs from its control's on one task of four, and the table says so
    arm("fp32-seed1-steps15-anchored", [1, 0, 1, 1], [1, 1, 0, 1], final_step=15)
    assert main(["--seeds", "0", "1", "--steps", "15", "--label", "anchored", "--root", str(tmp_path)]) == 0
    vs = capsys.readouterr().out.split("the 15-step anchored arms against the config's own 15-step run")[1]
    row = next(r for r in vs.splitlines() if r.startswith("| fp32-seed1-steps15-anchored")).split(" | ")
    assert row[-1] == "3/4 |"
    row = next(r for r in vs.splitlines() if r.startswith("| **pooled**")).split(" | ")
    assert row[0] == "| **pooled** (2 arms, n=10)" and row[1:3] == ["0.900", "0.500"]
    assert row[3].startswith("-40.0 [") and row[4] == "0.12"  # 4 broken, none fixed: p = 2 / 16

    # --run: a finished arm's checkpoints are deleted once its evaluations are read back (the table
    # needs only eval.jsonl); a failed arm keeps them; --keep-checkpoints keeps them all
    import benchmarks.learning_matrix as lm

    def fake_train(config, out, precision, seed, steps, eval_n, extra, **_) -> int:
        (out / "checkpoints" / "step-000001").mkdir(parents=True)
        (out / "checkpoints" / "step-000001" / "model.safetensors").write_bytes(b"x" * 1000)
        if seed == 4:
            return 1  # crashed before its final evaluation
        arm(out.name, [0, 1], [1, 1])
        return 0

    monkeypatch.setattr(lm, "run_arm", fake_train)
    # a bf16 arm where bf16 is emulated is refused before anything runs, unless asked for
    monkeypatch.setattr(lm, "fast_bf16", lambda device: False)
    bf16 = ["--seeds", "12", "--precision", "bf16-sampling", "--root", str(tmp_path), "--run"]
    emulated_arm = tmp_path / "calculator_agent" / "bf16-sampling-seed12"
    assert main(bf16) == 2
    assert "has no native bf16" in capsys.readouterr().err and not emulated_arm.exists()
    assert main([*bf16, "--allow-emulated"]) == 0 and (emulated_arm / "eval.jsonl").is_file()
    monkeypatch.setattr(lm, "fast_bf16", lambda device: True)
    assert main(["--seeds", "13", "--precision", "bf16", "--root", str(tmp_path), "--run"]) == 0
    assert main(["--seeds", "3", "4", "--precision", "fp16", "--root", str(tmp_path), "--run"]) == 0
    out = capsys.readouterr().out
    arms = tmp_path / "calculator_agent"
    assert not (arms / "fp16-seed3" / "checkpoints").exists() and "fp16-seed3: deleted its checkpoints" in out
    assert (arms / "fp16-seed4" / "checkpoints").is_dir() and "not run yet: fp16-seed4" in out
    assert (
        main(["--seeds", "5", "--precision", "fp16", "--root", str(tmp_path), "--run", "--keep-checkpoints"])
        == 0
    )
    assert (arms / "fp16-seed5" / "checkpoints" / "step-000001" / "model.safetensors").is_file()

    def stopped_train(config, out, precision, seed, steps, eval_n, extra, **_) -> int:
        fake_train(config, out, precision, 3, steps, eval_n, extra)
        (out / "config.yaml").write_text("train:\n  steps: 12\n")
        arm(out.name, [0, 1], [1, 1], final_step=9)  # a signal stopped it after step 9 of 12
        return 0

    monkeypatch.setattr(lm, "run_arm", stopped_train)
    capsys.readouterr()
    assert main(["--seeds", "8", "--precision", "fp16", "--root", str(tmp_path), "--run"]) == 0
    assert (arms / "fp16-seed8" / "checkpoints" / "step-000001" / "model.safetensors").is_file()
    assert "fp16-seed8: stopped at step 9 of 12; kept its checkpoints" in capsys.readouterr().out

    def cut_short_eval(config, out, precision, seed, steps, eval_n, extra, **_) -> int:
        stopped_train(config, out, precision, seed, steps, eval_n, extra)
        (out / "checkpoints" / "step_000012").mkdir()
        (out / "checkpoints" / "step_000012" / "state.pt").write_bytes(b"x")
        return 0  # every step trained; a signal cut the final evaluation short

    monkeypatch.setattr(lm, "run_arm", cut_short_eval)
    assert main(["--seeds", "9", "--precision", "fp16", "--root", str(tmp_path), "--run"]) == 0
    out = capsys.readouterr().out
    assert "fp16-seed9: trained all 12 steps, but its final evaluation was cut short" in out
    assert "--run again evaluates step 12" in out and (arms / "fp16-seed9" / "checkpoints").is_dir()

    # --run again: an arm stopped after step 9 goes on from its latest checkpoint, on the machine it
    # ran on (same CPU, flags, GPU and torch); one stopped on another machine is left as it stands
    from benchmarks._common import machine_info

    continued: list[tuple[str, bool]] = []

    def resumed_train(config, out, precision, seed, steps, eval_n, extra, *, resume=False, **_) -> int:
        continued.append((out.name, resume))
        arm(out.name, [0, 1], [1, 1], final_step=12)
        return 0

    (arms / "fp16-seed8" / "checkpoints" / "step_000009").mkdir()
    (arms / "fp16-seed8" / "checkpoints" / "step_000009" / "state.pt").write_bytes(b"x")
    monkeypatch.setattr(lm, "run_arm", resumed_train)
    seed8 = ["--seeds", "8", "--precision", "fp16", "--root", str(tmp_path), "--run"]
    assert main(seed8) == 0 and not continued
    captured = capsys.readouterr()
    assert "fp16-seed8: stopped at step 9 of 12 on 2-core CPU (avx512_bf16)" in captured.err
    assert "not continued here" in captured.err and "| fp16-seed8 |" in captured.out
    assert "| 1.000 (step 9 of 12) |" in captured.out  # the table says the arm has not reached its end
    (arms / "fp16-seed8" / "machine.json").write_text(json.dumps(machine_info()))
    assert main(seed8) == 0 and continued == [("fp16-seed8", True)]
    assert "stopped at step" not in capsys.readouterr().out
    assert lm.Arm(arms / "fp16-seed8").final.step == 12
    assert main(seed8) == 0 and len(continued) == 1  # it reached step 12: nothing left to run

    # --jobs 2: two arms train at once (each waits for the other at a barrier), the table keeps the
    # order of the arms asked for
    import threading

    both = threading.Barrier(2, timeout=10)
    deadlines = []

    def fake_train_together(config, out, precision, seed, steps, eval_n, extra, *, stop_at=None, **_) -> int:
        deadlines.append(stop_at)
        both.wait()  # raises BrokenBarrierError unless the other arm runs at the same time
        arm(out.name, [0, 1], [1, 1] if seed == 7 else [0, 1])
        return 0

    monkeypatch.setattr(lm, "run_arm", fake_train_together)
    capsys.readouterr()
    argv = ["--seeds", "7", "6", "--precision", "fp16", "--root", str(tmp_path), "--run", "--jobs", "2"]
    assert main([*argv, "--stop-after", "420"]) == 0
    assert len(set(deadlines)) == 1 and deadlines[0] > time.monotonic() + 400  # one deadline for all
    names = [
        r.split(" | ")[0].lstrip("| ") for r in capsys.readouterr().out.splitlines() if r.startswith("| fp16")
    ]
    assert names == ["fp16-seed7", "fp16-seed6"]
    late = ["--seeds", "11", "--precision", "fp16", "--root", str(tmp_path), "--run", "--stop-after", "0"]
    assert (
        main(late) == 1 and "fp16-seed11: not started, --stop-after 0 s had passed" in capsys.readouterr().err
    )
    assert not (tmp_path / "calculator_agent" / "fp16-seed11").exists() and len(deadlines) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_rss_trace_follows_a_child_that_grows(tmp_path, capsys) -> None:
    from benchmarks.rss_trace import main

    grow = "import time; x = bytearray(200_000_000); time.sleep(1.5)"  # ~200 MB, touched (zeroed)
    out = tmp_path / "trace.tsv"
    assert (
        main(["--every", "0.1", "--window", "60", "--out", str(out), "--", sys.executable, "-c", grow]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["| window (60 s) | largest sample | resident GB |", "|---|---|---|"]
    peak = float(lines[-1].split("peak ")[1].removesuffix(" GB"))
    assert 0.2 <= peak < 1.0, lines[-1]
    samples = [float(line.split("\t")[1]) for line in out.read_text().splitlines()]
    assert max(samples) == peak and len(samples) >= 5
    assert main(["--", sys.executable, "-c", "raise SystemExit(3)"]) == 3  # the command's exit code


def test_learning_matrix_signals_keep_steps_without_an_update(tmp_path) -> None:
    """A step whose every group had one reward trains nothing; its "0/6" is the no-signal count
    the table exists to show, so it stays, with "-" where only an update has a value."""
    import json

    from benchmarks.learning_matrix import signals_table, step_signals

    trained = {"sampler_ratio_min": 0.99, "sampler_ratio_max": 1.01, "entropy": 0.03, "kl": 0.002}
    lines = [
        {"step": 0, "sft/loss": 0.2, "sft/tokens": 100.0, "sft/epoch": 0},
        {
            "step": 1,
            "episodes": 96.0,
            "loss": 0.1,
            "groups_trained": 4.0,
            "groups_sampled": 6.0,
            "time/rollout_s": 60.0,
            "time/update_s": 200.0,
            **trained,
        },
        {
            "step": 2,
            "episodes": 96.0,
            "groups_trained": 0.0,
            "groups_sampled": 6.0,
            "time/rollout_s": 50.0,
            "time/update_s": 0.0,
        },
        {"step": 2, "eval/accuracy": 0.9, "eval/ci95_low": 0.85, "eval/ci95_high": 0.94},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert [s["groups_trained"] for s in step_signals(tmp_path)] == [4.0, 0.0]

    class Arm:
        out = tmp_path

    row = signals_table([("arm", Arm())]).splitlines()[-1]  # type: ignore[list-item]
    assert row == "| arm | 0.99-1.01, - | 0.030, - | 4/6, 0/6 | 0.002, - | 60+200 s, 50+0 s |"
