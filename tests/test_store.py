import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from flowgrpo.runs.store import StoreError, TrajectoryWriter, read_trajectories
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
    # The fragment is now a middle line: it loses only itself, with a warning naming file and line.
    caplog.clear()
    assert [t.id for t in read_trajectories(path)] == ["t0", "t1", "t3"]
    assert f"{path}:3: skipping a torn or unreadable record" in caplog.text


def test_garbage_lines_anywhere_lose_only_themselves(tmp_path, caplog):
    path = tmp_path / "trajs.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(_traj(0))
    with open(path, "a") as f:
        f.write('[1, 2]\n{"schema_version": "x"}\n' + "[" * 100_000 + "\n")  # not trajectories
    with TrajectoryWriter(path) as w:
        w.write(_traj(1))
    assert [t.id for t in read_trajectories(path)] == ["t0", "t1"]
    assert caplog.text.count("skipping") == 3


def test_unencodable_text_is_written_escaped_and_reads_back(tmp_path):
    """A lone surrogate (what JSON's "\\ud800" escape in model output decodes to) cannot be UTF-8
    encoded; the writer escapes it instead of raising, and the record reads back unchanged."""
    path = tmp_path / "trajs.jsonl"
    bad = _traj(0).model_copy(update={"metadata": {"note": "a\ud800b"}})
    with TrajectoryWriter(path) as w:
        w.write(bad)
        w.write(_traj(1))
    raw = path.read_bytes()
    raw.decode("utf-8")  # valid UTF-8 on disk
    assert b"\\ud800" in raw
    assert read_trajectories(path) == [bad, _traj(1)]


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
        from flowgrpo.runs.store import TrajectoryWriter
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
