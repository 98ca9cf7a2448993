"""Data-parallel training (flowgrpo.training.distributed): shards, global aggregation weights, and a 2-rank
gloo run on CPU that ends with a 1-rank run's parameters."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from flowgrpo.config import load_config
from flowgrpo.env import BaseEnvironment, StepResult
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.runs.rundir import RunDir
from flowgrpo.runs.store import read_trajectories
from flowgrpo.training.batching import Row, micro_batches
from flowgrpo.training.distributed import DistContext, check_supported, shard
from flowgrpo.training.trainer import Trainer
from flowgrpo.types import Message, ParsedAction, Task
from tests.toy import PlainParser


def test_shards_are_contiguous_and_differ_by_at_most_one():
    assert [shard(10, r, 3) for r in range(3)] == [range(0, 4), range(4, 7), range(7, 10)]
    assert [shard(2, r, 4) for r in range(4)] == [range(0, 1), range(1, 2), range(2, 2), range(2, 2)]
    assert shard(5, 0, 1) == range(5)


def _row(n_prompt: int, n_action: int, seq: int) -> Row:
    n = n_prompt + n_action
    return Row(
        input_ids=[1] * n,
        loss_mask=[0] * n_prompt + [1] * n_action,
        advantages=[0.0] * n,
        old_logprobs=[0.0] * n,
        turn_index=[0] * n,
        seq_index=seq,
    )


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        ("token_mean", 1 / 5),  # 2 + 3 action tokens in the whole batch
        ("seq_mean_token_mean", 1 / (2 * 2)),  # 2 trajectories; row a has 2 tokens
        ("seq_mean_token_sum_norm", 1 / (2 * 5)),  # Dr.GRPO: T = the whole batch's longest row, 5
    ],
)
def test_a_ranks_weights_are_normalised_over_the_whole_batch(agg, expected):
    a, b = _row(1, 2, 0), _row(2, 3, 1)  # rank 0 trains a, rank 1 trains b
    (mb,) = micro_batches([a], 64, agg=agg, weights_over=[a, b])
    assert torch.allclose(mb.token_weights, torch.tensor([[0.0, expected, expected]]))
    # alone, row a would be the whole batch (weights 1/2, 1/2, 1/3): a rank's local normaliser
    (alone,) = micro_batches([a], 64, agg=agg)
    assert not torch.allclose(alone.token_weights, mb.token_weights)
    # the two ranks' weights together are the 1-rank weights
    (whole,) = micro_batches([b, a], 64, agg=agg)
    (mb_b,) = micro_batches([b], 64, agg=agg, weights_over=[a, b])
    assert float(mb.token_weights.sum() + mb_b.token_weights.sum()) == pytest.approx(
        float(whole.token_weights.sum())
    )


def test_a_single_process_is_not_distributed():
    ctx = DistContext()
    assert not ctx.enabled and ctx.is_main
    check_supported(load_config(None, ["train.async_staleness=1", "algorithm.tis=token"]), ctx)


def test_options_without_a_data_parallel_form_are_refused_with_what_to_change():
    cfg = load_config(None, ["train.async_staleness=1", "algorithm.tis=token", "algorithm.entropy_top_q=0.2"])
    with pytest.raises(ValueError, match=r"2 ranks.*async_staleness=0.*entropy_top_q"):
        check_supported(cfg, DistContext(rank=1, world_size=2))


# ------------------------------------------------------------------ 2 ranks vs 1 rank, end to end
class SayEnv(BaseEnvironment):
    """One turn; the reward pays when the first sampled token id is even."""

    name = "say"
    tools: list = []
    parser = PlainParser()

    async def reset(self, task: Task) -> list[Message]:
        return [Message(role="user", content=task.prompt)]

    async def step(self, action: ParsedAction) -> StepResult:
        return StepResult(terminated=True)

    def tasks(self, split: str) -> list[Task]:
        return [Task(id=f"{split}-{i}", prompt=f"task {i}") for i in range(12)]


def _even_first_token(traj, task) -> float:
    ids = traj.turns[0].action_ids if traj.turns else []
    return 1.0 if ids and ids[0] % 2 == 0 else 0.0


STEPS = 3


def _trainer(out_dir: str, *overrides: str) -> Trainer:
    model, tok = tiny_model(tiny_tokenizer(), seed=0)
    cfg = load_config(
        None,
        [
            f"run.output_dir={out_dir}",
            "run.progress=false",
            "run.save_every=0",
            "model.autocast=null",
            # fp32 sampling: a bf16 copy's logprobs move with the batch's shape (each rank decodes
            # other rows), and the TIS weights with them
            "model.rollout_dtype=float32",
            "rollout.max_turns=1",
            "rollout.max_new_tokens=3",
            "rollout.sampling.seed=11",  # per-episode generators: samples do not depend on the shard
            "rewards=[{name: even}]",
            f"train.steps={STEPS}",
            "train.tasks_per_step=5",  # 3 + 2 groups: uneven shards
            "train.group_size=4",
            "train.minibatches_per_batch=2",
            "train.lr=1e-5",  # see the tolerance below
            "train.micro_batch_tokens=64",
            "algorithm.kl_coef=0.01",
            "algorithm.tis=token",
            *overrides,
        ],
    )
    reward = CompositeReward([RewardSpec(name="even")], fns={"even": _even_first_token})
    return Trainer(cfg, model=model, tokenizer=tok, env_factory=SayEnv, reward=reward)


def _rank(rank: int, world: int, port: int, out_dir: str, result_dir: str, parallel: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    first = _trainer(out_dir, f"train.parallel={parallel}")
    assert first.dist.world_size == world and first.dist.rank == rank
    first.train(until_step=STEPS - 1)  # rank 0 checkpoints step 2; every rank resumes from it
    tr = _trainer(out_dir, "run.resume=true", f"train.parallel={parallel}")
    assert tr.step == STEPS - 1
    tr.train()
    # AdamW's moments this rank holds, against the whole model's size (fsdp2: about half)
    held = sum(
        (s["exp_avg"].to_local() if isinstance(s["exp_avg"], DTensor) else s["exp_avg"]).numel()
        for s in tr.optimizer.state.values()
    )
    torch.save(
        {
            "params": {k: v.detach().clone() for k, v in tr.model.state_dict().items()},
            "moment_share": held / sum(p.numel() for p in tr.model.parameters()),
        },
        f"{result_dir}/rank{rank}.pt",
    )
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_gloo_ranks_end_with_the_parameters_of_one_rank_also_across_a_resume(tmp_path, parallel):
    """The 2-rank run stops after step 2 and resumes (every rank from rank 0's checkpoint); the
    1-rank run goes straight through. ``fsdp2``: each rank holds half the parameters, gradients and
    AdamW moments of the trained copy (FSDP2), and the ranks' full models, refreshed from the shards
    after every update, still end with the 1-rank run's parameters.

    Tolerance: atol 1e-6, while 3 steps move the parameters by up to ~3e-5 (checked below).
    Both runs sample the same episodes (per-episode seeds; checked: same rewards and tokens) and
    normalise the loss over the same global batch, so the summed gradients agree up to fp32
    rounding: a rank's micro-batches hold other rows (other padding, other rounding in the forward)
    and the gradient is summed over ranks in another order (~1e-7 relative). AdamW divides each
    coordinate by its own gradient scale, so a gradient near eps (1e-8) turns an absolute gradient
    error e into a parameter error up to lr * e / eps: with lr 1e-5 that stays below 1e-6; with
    lr 3e-2 the same runs differ by 1.6e-4 (measured), which is why the test uses a realistic lr."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = _trainer(str(tmp_path / "one"))
        one.train()
        expected = {k: v.detach().clone() for k, v in one.model.state_dict().items()}
    finally:
        torch.set_num_threads(n)
    mp.spawn(
        _rank, args=(2, _free_port(), str(tmp_path / "two"), str(tmp_path), parallel), nprocs=2, join=True
    )
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    got0, got1 = r0["params"], r1["params"]
    if parallel == "fsdp2":  # the tiny model's tied embedding and 2 layers split about evenly
        assert 0.4 < r0["moment_share"] < 0.6 and 0.4 < r1["moment_share"] < 0.6
        assert r0["moment_share"] + r1["moment_share"] == pytest.approx(1.0, abs=0.01)
    else:
        assert r0["moment_share"] == r1["moment_share"] == 1.0
    for k in expected:
        assert torch.equal(got0[k], got1[k]), f"ranks disagree on {k}"
    worst = max(float((got0[k] - v).abs().max()) for k, v in expected.items())
    print(f"largest parameter difference, 2 ranks vs 1: {worst:.3g}")
    assert worst <= 1e-6, worst
    # the parameters moved: the comparison is not of two untouched models
    initial, _ = tiny_model(tiny_tokenizer(), seed=0)
    moved = max(float((p - expected[k]).abs().max()) for k, p in initial.state_dict().items())
    assert moved > 1e-5, moved
    # rank 0 wrote the whole batch and the global metrics, the same as the 1-rank run's
    m1 = [m.values for m in RunDir(tmp_path / "one").metrics() if "reward_mean" in m.values]
    m2 = [m.values for m in RunDir(tmp_path / "two").metrics() if "reward_mean" in m.values]
    assert len(m1) == len(m2) == STEPS
    for a, b in zip(m1, m2, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["train_tokens"] == b["train_tokens"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
    trajs = read_trajectories(tmp_path / "two" / "trajectories" / "step_000001.jsonl")
    assert len(trajs) == 5 * 4
    assert (tmp_path / "two" / "checkpoints").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("parallel, warm", [("ddp", False), ("fsdp2", False), ("ddp", True)])
def test_the_torchrun_launch_trains_with_rank_0_writing(tmp_path, parallel, warm):
    """``torchrun --nproc_per_node 2 -m flowgrpo train``: the command users run, gloo on CPU; with a
    warm start every rank joins the step-0 checkpoint that rank 0 writes (else the ranks hang)."""
    (tmp_path / "cfg.yaml").write_text("model:\n  name: tiny\n")
    settings = [
        "model.autocast=null",
        "env.name=arithmetic",
        "train.steps=3",
        "train.tasks_per_step=3",
        "train.group_size=4",
        "rollout.max_turns=2",
        "rollout.max_new_tokens=16",
        "run.save_every=2",
        "run.progress=false",
        f"train.parallel={parallel}",
        f"run.output_dir={tmp_path / 'run'}",
        *(["sft.enabled=true", "sft.tasks=4", "sft.epochs=1", "rollout.max_new_tokens=256"] if warm else []),
    ]
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "flowgrpo"]
    argv += ["train", str(tmp_path / "cfg.yaml"), "--eval-n", "2", "--untrained-n", "2", "--no-report"]
    for s in settings:
        argv += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunDir(tmp_path / "run")
    steps = [m.step for m in run.metrics() if "reward_mean" in m.values]
    assert steps == [1, 2, 3]  # one record per step: rank 1 writes none
    assert len(read_trajectories(tmp_path / "run" / "trajectories" / "step_000003.jsonl")) == 3 * 4
    assert (tmp_path / "run" / "checkpoints" / "step_000003").is_dir()
    assert proc.stdout.count("evaluating the untrained policy") == 1  # rank 0 evaluates


def test_a_checkpoint_remembers_whether_fsdp2_wrote_its_optimizer_state(tmp_path):
    """FSDP2 writes the whole optimizer state keyed by parameter name; a run without it reads
    torch's index-keyed state. Resuming across the two is refused with what to do."""
    tr = _trainer(str(tmp_path))
    path = tr.save()
    assert torch.load(path / "state.pt", weights_only=False)["extra"]["optimizer_keys"] == "index"
    state = torch.load(path / "state.pt", weights_only=False)
    state["extra"]["optimizer_keys"] = "name"  # as a train.parallel=fsdp2 run writes it
    torch.save(state, path / "state.pt")
    with pytest.raises(ValueError, match=r"written with train.parallel=fsdp2.*resume it the same way"):
        _trainer(str(tmp_path), "run.resume=true")
