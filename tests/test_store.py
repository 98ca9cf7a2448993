import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from flowgrpo.store import StoreError, TrajectoryWriter, read_trajectories
from flowgrpo.types import Message, Trajectory, Turn


def _traj(i: int, n_tokens: int = 4) -> Trajectory:
    return Trajectory(
        id=f"t{i}",
        group_id=f"g{i // 2}",
        turns=[
            Turn(
                prompt_ids=list(range(n_tokens)),
                action_ids=[i] * n_tokens,
                action_logprobs=[-0.1] * n_tokens,
                action=Message(role="assistant", content=f"answer {i}"),
            )
        ],
        reward=float(i),
    )


def test_write_and_read_back(tmp_path):
    path = tmp_path / "trajs.jsonl"
    with TrajectoryWriter(path) as w:
        w.write_many(_traj(i) for i in range(5))
    back = read_trajectories(path)
    assert [t.id for t in back] == [f"t{i}" for i in range(5)]
    assert back[3] == _traj(3)


def test_torn_last_line_is_skipped_and_next_writer_starts_clean(tmp_path, caplog):
    path = tmp_path / "trajs.jsonl"
    with TrajectoryWriter(path) as w:
        w.write_many([_traj(0), _traj(1)])
    full = _traj(2).model_dump_json()
    with open(path, "a") as f:
        f.write(full[: len(full) // 2])  # a write torn in half
    assert [t.id for t in read_trajectories(path)] == ["t0", "t1"]
    assert "truncated last" in caplog.text
    with TrajectoryWriter(path) as w:  # reopening must not glue the next record to the fragment
        w.write(_traj(3))
    # The fragment is now a middle line: strict mode names it, lenient mode skips it.
    with pytest.raises(StoreError, match=":3: not valid JSON"):
        read_trajectories(path)
    assert [t.id for t in read_trajectories(path, strict=False)] == ["t0", "t1", "t3"]


def test_unknown_schema_version_is_a_clear_error(tmp_path):
    path = tmp_path / "trajs.jsonl"
    data = json.loads(_traj(0).model_dump_json())
    data["schema_version"] = 99
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(StoreError, match="schema_version 99 is not supported"):
        read_trajectories(path)


def test_writer_killed_mid_write_loses_only_the_torn_line(tmp_path):
    """A real process writes large records in a loop and is SIGKILLed: everything but the record
    being written at that moment reads back."""
    path = tmp_path / "trajs.jsonl"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from flowgrpo.store import TrajectoryWriter
        from flowgrpo.types import Message, Trajectory, Turn
        w = TrajectoryWriter({str(path)!r})
        i = 0
        while True:
            t = Trajectory(id=f"t{{i}}", turns=[Turn(prompt_ids=list(range(20000)), action_ids=[1] * 20000,
                action_logprobs=[-0.1] * 20000, action=Message(role="assistant", content="x"))])
            w.write(t)
            i += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while time.time() < deadline and (not path.exists() or path.stat().st_size < 2_000_000):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    raw = path.read_bytes()
    complete = raw.count(b"\n")
    assert complete >= 3
    back = read_trajectories(path)
    assert [t.id for t in back] == [f"t{i}" for i in range(complete)]
    assert all(len(t.turns[0].prompt_ids) == 20000 for t in back)
