"""The HTML report, rendered in a real headless browser (Debian's chromium), and plot.png.

The run directory comes from tests/test_replay.py's ``build_run`` (real rollouts of the
arithmetic env's oracle and a wrong-answer policy through the rollout engine, real rewards and
advantages). ``--dump-dom`` runs the page's JavaScript, so reading the summary values back proves
the page rendered, not just that a file was written.
"""

from __future__ import annotations

import fcntl
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from test_replay import build_run

from flowgrpo.cli import main
from flowgrpo.modeling.models import tiny_tokenizer
from flowgrpo.runs.report import (
    advantage_color,
    build_report,
    nice_ticks,
    plot_run,
    render_report,
    svg_line_chart,
    token_pieces,
)
from flowgrpo.runs.rundir import RunDir
from flowgrpo.runs.store import TrajectoryWriter
from flowgrpo.types import Message, Trajectory, Turn


def _find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed once (apt, as root) under a file lock shared by workers."""
    path = _find_chromium()
    if path:
        return path
    if os.geteuid() != 0:
        pytest.skip("chromium is not installed and installing it needs root: `apt-get install chromium`")
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and this system has no apt-get to install it")
    lock = Path(tempfile.gettempdir()) / "flowgrpo-chromium-install.lock"
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        path = _find_chromium()  # another worker may have installed it meanwhile
        if path is None:
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            for cmd in (
                ["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "-o", "DPkg::Lock::Timeout=300", "chromium"],
            ):
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                if r.returncode != 0:  # in CI the browser test must run: a failed install fails
                    (pytest.fail if os.environ.get("CI") else pytest.skip)(
                        f"could not install chromium ({' '.join(cmd)}): {r.stderr[-500:]}"
                    )
            path = _find_chromium()
    if path is None:
        pytest.skip("apt-get installed chromium but no chromium binary is on PATH")
    return path


def _chromium(browser: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [
        browser,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        f"--user-data-dir={cwd / 'profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("report") / "RUN")


def test_report_renders_in_a_real_browser(run_dir, chromium, tmp_path):
    out = build_report(run_dir, tokenizer="auto")  # config says model: tiny -> tiny tokenizer
    assert out == run_dir / "report.html"
    page = out.read_text()
    # self-contained: nothing fetched from anywhere
    assert not re.search(r"<(link|img|iframe)\b", page)
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert "http://" not in page and "https://" not in page

    r = _chromium(chromium, "--dump-dom", out.as_uri(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout

    def shown(elem_id: str) -> str:
        m = re.search(rf'id="{elem_id}">([^<]*)<', dom)
        assert m, f"#{elem_id} not in the rendered DOM"
        return html.unescape(m.group(1))

    run = RunDir(run_dir)
    last = run.metrics()[-1].values
    assert 'id="summary" data-rendered="yes"' in dom  # the inline script ran
    assert shown("s-steps") == "3" == str(len(run.metrics()))
    assert shown("s-final-step") == "3"
    assert shown("s-reward") == f"{last['reward_mean']:.3f}" == "1.200"  # accuracy 1 + 0.2 * format 1
    assert shown("s-accuracy") == "1.000"
    assert shown("s-eval") == "1.000" and shown("s-evals") == "2"
    # the per-step table has one row per logged step; step 1's accuracy is 0.5 (2 of 4 right)
    table = re.search(r'<table id="metrics-table">.*?</table>', dom, re.S).group(0)
    assert table.count("<tr>") == 1 + 3
    assert '<td data-col="accuracy">0.5</td>' in table
    # trajectories: the first step's first oracle episode, with its answer and tokens as text
    first = run.trajectories(1)[0]
    sec = re.search(rf'<section class="traj" data-traj-id="{first.id}">.*?</section>', dom, re.S).group(0)
    answer = re.search(r'<span class="answer">([^<]*)</span>', sec).group(1)
    assert answer == first.final_message.content.split("<answer>")[1].split("</answer>")[0]
    n_tokens = sec.count('class="t c"') + sec.count('class="t a"')
    assert n_tokens == first.num_tokens
    assert sec.count('class="t a"') == first.num_action_tokens
    # the tokens, decoded one by one by the run's tokenizer, read back as the exact context
    tokens_div = re.search(r'<div class="tokens">(.*?)</div>', sec, re.S).group(1)
    text = html.unescape(re.sub(r"<[^>]+>", "", tokens_div))
    tok = tiny_tokenizer()
    assert text == tok.decode(first.turns[0].prompt_ids + first.turns[0].action_ids)
    assert text.startswith("<|im_start|>system\n")
    # positive advantage -> green; the other member of the group (wrong answer) -> red
    assert first.turns[0].advantage > 0 and "rgba(0,170,60," in sec
    wrong = run.trajectories(1)[1]
    sec_w = re.search(rf'data-traj-id="{wrong.id}">.*?</section>', dom, re.S).group(0)
    assert "rgba(220,30,30," in sec_w and '<span class="answer">0</span>' in sec_w

    shots = Path(tempfile.gettempdir()) / "flowgrpo-report-screenshots"
    shots.mkdir(exist_ok=True)
    shot = shots / "report.png"
    r = _chromium(chromium, f"--screenshot={shot}", "--window-size=1200,2000", out.as_uri(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (w, h) == (1200, 2000)


def test_model_output_is_escaped(tmp_path, chromium):
    """A trajectory whose action tries to inject markup stays text, in the file and in the DOM."""
    tok = tiny_tokenizer()
    evil = '</span></script><script>document.title="pwned"</script><b id="inj">x</b>'
    ids = tok.encode(evil)
    traj = Trajectory(
        task_id="t<1>",
        env="arithmetic",
        reward=0.5,
        turns=[
            Turn(
                prompt_ids=tok.encode("hi"),
                action_ids=ids,
                action_logprobs=[0.0] * len(ids),
                action=Message(role="assistant", content=evil + "<answer>" + evil + "</answer>"),
                advantage=-1.0,
            )
        ],
    )
    run = tmp_path / "RUN"
    with TrajectoryWriter(run / "trajectories" / "step_000001.jsonl") as w:
        w.write(traj)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5, "accuracy": 0.0}) + "\n")
    out = build_report(run, tokenizer=tok)
    page = out.read_text()
    assert '<b id="inj">' not in page and "&lt;b id=&quot;inj&quot;&gt;" in page
    r = _chromium(chromium, "--dump-dom", out.as_uri(), cwd=tmp_path)
    assert r.returncode == 0
    assert '<b id="inj">' not in r.stdout and '&lt;b id="inj"&gt;' in r.stdout  # text, not an element
    assert "<title>flowgrpo report: RUN</title>" in r.stdout  # the injected script never ran
    assert 'data-rendered="yes"' in r.stdout


def test_report_without_tokenizer_shows_ids(run_dir):
    run = RunDir(run_dir)
    page = render_report(run, tokenizer=None, max_trajectories=1)
    t = run.trajectories(1)[0]
    assert page.count('<section class="traj"') == 1
    assert f"⟨{t.turns[0].prompt_ids[0]}⟩" in page and "tokens shown as ids" in page


def test_max_trajectories_and_steps(run_dir):
    run = RunDir(run_dir)
    assert render_report(run, max_trajectories=3).count('<section class="traj"') == 3
    page = render_report(run, max_trajectories=8, steps=[2])
    assert page.count('<section class="traj"') == 4 and "from steps 2\n" in page
    assert render_report(run, max_trajectories=0).count('<section class="traj"') == 0


def test_plot_run_writes_a_png(run_dir):
    out = plot_run(run_dir)
    assert out == run_dir / "plot.png"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_cli_report(run_dir, capsys, tmp_path):
    target = tmp_path / "r.html"
    assert main(["report", str(run_dir), "-o", str(target), "--max-trajectories", "2", "--no-tokenizer"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {target}" in out and f"wrote {run_dir / 'plot.png'}" in out
    assert target.read_text().count('<section class="traj"') == 2
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_nice_ticks_hand_computed():
    assert nice_ticks(0, 1, 5) == [0, 0.25, 0.5, 0.75, 1.0]
    assert nice_ticks(0.7, 1.2, 5) == [0.6, 0.8, 1.0, 1.2]  # raw step 0.125 -> 0.2
    assert nice_ticks(1, 3, 6, integer=True) == [1, 2, 3]
    assert nice_ticks(1, 200, 6, integer=True) == [0, 50, 100, 150, 200]
    assert nice_ticks(1, 1, 5) == [0.9, 1.0, 1.1]


def test_svg_chart_points_land_on_the_axes():
    svg = svg_line_chart({"train": [(1, 0.0), (3, 1.0)]}, title="a<b", width=460, height=260)
    assert "a&lt;b" in svg and "<svg" in svg
    # plot box: x in [52, 448], y in [28, 226]; x ticks 1..3, y ticks 0..1
    assert '<circle cx="52.0" cy="226.0"' in svg and '<circle cx="448.0" cy="28.0"' in svg
    assert "no data" in svg_line_chart({"train": []}, title="t")


def test_token_pieces_and_colours():
    tok = tiny_tokenizer()
    ids = tok.encode("The answer is 19. <answer>42</answer>")
    assert "".join(token_pieces(ids, tok)) == tok.decode(ids)
    assert token_pieces([5, 7], None) == ["⟨5⟩", "⟨7⟩"]
    assert advantage_color(2.0, 2.0) == "rgba(0,170,60,0.700)"
    assert advantage_color(-1.0, 2.0) == "rgba(220,30,30,0.390)"
    assert advantage_color(0.0, 2.0) == "rgba(0,0,0,0.06)"
