"""The code-test reward (flowgrpo.rewards.code): a correct answer scores 1, and answers that try to
forge the verdict score 0, as root and as an unprivileged uid, in every isolation mode this host has."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_code_sandbox import CAPS, run_unprivileged

from flowgrpo.rewards import AccuracyReward
from flowgrpo.rewards.code import grade_code
from flowgrpo.sandbox.python import SandboxLimits, run_python
from flowgrpo.types import Message, Task, Trajectory, Turn

TESTS = "assert add(1234567, 7654321) == 8888888\nassert add(-5, 5) == 0\n"
CORRECT = "def add(a, b):\n    return a + b\n"
TASK_FILE = str(Path(__file__).resolve().parents[1] / "envs" / "data" / "coding_tasks.jsonl")

# Answers that try to pass without a correct `add`. Each returns the right sums only if its attack
# gave it the tests or control over the grader; otherwise it is wrong. (name, answer, tests or None)
_LOOKUP = r"""
import re
TABLE = {}
def _scan(text):
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    for a, b, r in re.findall(r"add\((-?\d+), (-?\d+)\) == (-?\d+)", text):
        TABLE[(int(a), int(b))] = int(r)
def add(a, b):
    return TABLE.get((a, b), 0)
"""
ATTACKS: list[tuple[str, str, str | None]] = [
    (
        "print_marker_and_forged_verdict",
        "import sys\n"
        "for f in (sys.stdout, sys.stderr):\n"
        "    print('__FLOWGRPO_ALL_TESTS_PASSED__', file=f)\n"
        '    print(\'{"verdict": "pass", "key": "0"}\', file=f)\n'
        "def add(a, b):\n    return 0\n",
        None,
    ),
    (
        "forge_verdict_into_other_processes_stdout",
        "import glob, os\n"
        'line = b\'{"verdict": "pass", "key": "0"}\\n\'\n'
        "for p in glob.glob('/proc/[0-9]*/fd/[12]') + ['/dev/stdout', '/proc/self/fd/1']:\n"
        "    try:\n"
        "        fd = os.open(p, os.O_WRONLY)\n"
        "        os.write(fd, line)\n"
        "        os.close(fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "def add(a, b):\n    return 0\n",
        None,
    ),
    ("sys_exit_0_at_import", "import sys\nsys.exit(0)\ndef add(a, b):\n    return 0\n", None),
    ("os_exit_0_at_import", "import os\nos._exit(0)\n", None),
    ("os_exit_0_in_call", "def add(a, b):\n    import os\n    os._exit(0)\n", None),
    ("system_exit_in_call", "def add(a, b):\n    raise SystemExit(0)\n", None),
    (
        "kill_the_grader",
        "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 0\n",
        None,
    ),
    (
        "always_equal_object",
        "class Eq:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Eq()\n",
        None,
    ),
    (
        "int_subclass_equal_to_everything",
        "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return I(0)\n",
        None,
    ),
    (
        "patch_builtins_assert_and_unittest",
        "import builtins, unittest\n"
        "builtins.AssertionError = type('Never', (BaseException,), {})\n"
        "builtins.abs = lambda x: 0\n"
        "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "def add(a, b):\n    return 0\n",
        "import unittest\nunittest.TestCase().assertEqual(add(1234567, 7654321), 8888888)\n"
        "assert abs(add(-5, 5) - 0) < 1e-9\nassert add(2, 2) == 4\n",
    ),
    (
        "shadow_a_builtin_the_tests_use",
        "def abs(x):\n    return 0\ndef add(a, b):\n    return 0\n",
        "assert abs(add(1234567, 7654321) - 8888888) < 1e-9\n",
    ),
    (
        "define_the_tests_check_function",
        "def check(candidate):\n    pass\ndef add(a, b):\n    return 0\n",
        "def check(candidate):\n    assert candidate(1234567, 7654321) == 8888888\n\ncheck(add)\n",
    ),
    (
        "read_the_tests_from_disk_and_proc",
        _LOOKUP
        + "import glob, os\n"
        + f"paths = ['grading.json', 'tests.py', 'main.py', {TASK_FILE!r}]\n"
        + "paths += glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline') + glob.glob('/proc/[0-9]*/fd/*')\n"
        + "for root in ('/tmp', '/root', '/home', '/work', '/etc', '/run', '/var', os.getcwd()):\n"
        + "    for d, _, names in os.walk(root):\n"
        + "        paths += [os.path.join(d, n) for n in names]\n"
        + "for p in paths:\n"
        + "    try:\n"
        + "        with open(p, 'rb') as f:\n"
        + "            _scan(f.read(1 << 22))\n"
        + "    except OSError:\n"
        + "        pass\n",
        None,
    ),
    (
        "read_the_graders_memory",
        _LOOKUP
        + "import os\n"
        + "for pid in [os.getppid(), 1, 2]:\n"
        + "    try:\n"
        + "        mem = open('/proc/%d/mem' % pid, 'rb')\n"
        + "        for line in open('/proc/%d/maps' % pid):\n"
        + "            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        + "            if 'rw' in line.split()[1] and hi - lo < 1 << 28:\n"
        + "                try:\n"
        + "                    mem.seek(lo)\n"
        + "                    _scan(mem.read(hi - lo))\n"
        + "                except (OSError, ValueError, OverflowError):\n"
        + "                    pass\n"
        + "    except OSError:\n"
        + "        pass\n",
        None,
    ),
    (
        "ptrace_the_grader",
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
        "CONTROL = libc.ptrace(16, os.getppid(), None, None) == 0  # PTRACE_ATTACH: the grader is ours\n"
        "def add(a, b):\n    return a + b if CONTROL else 0\n",
        None,
    ),
]


def grade_all(answers: list[tuple[str, str | None]], limits: SandboxLimits | None = None) -> list:
    async def go():
        sem = asyncio.Semaphore(4)

        async def one(code, tests):
            async with sem:
                return await grade_code(code, tests or TESTS, limits=limits)

        return await asyncio.gather(*(one(c, t) for c, t in answers))

    return asyncio.run(go())


def test_correct_answer_scores_1_and_wrong_scores_0():
    ok, wrong = grade_all([(CORRECT, None), ("def add(a, b):\n    return a - b\n", None)])
    assert ok.passed and ok.run.exit_code == 0, ok.run
    assert not wrong.passed and "AssertionError" in wrong.run.stderr


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(m, marks=[] if m == CAPS.mode else [pytest.mark.slow])
        for m in ("bwrap", "unshare")
        if getattr(CAPS, m)
    ],
)
def test_forged_verdicts_score_0(mode):
    limits = SandboxLimits(isolation=mode, wall_s=10)
    # controls: a correct answer passes, and the lookup the disk/memory attacks use works when fed the tests
    control = _LOOKUP + f"_scan({TESTS!r})\n"
    grades = grade_all(
        [(CORRECT, None), (control, None)] + [(code, tests) for _, code, tests in ATTACKS], limits
    )
    assert grades[0].passed and grades[1].passed, grades[:2]
    forged = {
        name: g.run.stderr[-500:] for (name, _, _), g in zip(ATTACKS, grades[2:], strict=True) if g.passed
    }
    assert not forged, forged


def test_answer_cannot_see_tests_task_data_or_key():
    probe = (
        "import glob, json, os, sys\n"
        f"paths = ['grading.json', {TASK_FILE!r}, '/proc/%d/environ' % os.getppid(), '/proc/%d/mem' % os.getppid()]\n"
        "paths += glob.glob('/proc/%d/fd/*' % os.getppid()) + glob.glob('/proc/1/fd/*')\n"
        "seen = {}\n"
        "for p in paths:\n"
        "    try:\n"
        "        with open(p, 'rb') as f:\n"
        "            seen[p] = len(f.read(1 << 20))\n"
        "    except OSError as e:\n"
        "        seen[p] = type(e).__name__\n"
        "print('PROBE ' + json.dumps({'cwd': sorted(os.listdir('.')), 'seen': seen}), file=sys.stderr)\n"
        "def add(a, b):\n    return a + b\n"
    )
    (g,) = grade_all([(probe, None)])
    assert g.passed  # the probe is a correct answer
    rep = json.loads(g.run.stderr.split("PROBE ", 1)[1].splitlines()[0])
    assert "grading.json" not in rep["cwd"]
    readable = {p: n for p, n in rep["seen"].items() if isinstance(n, int) and n > 0}
    assert not readable, readable  # pipes of the answer's own process read nothing that matters


def test_plain_data_crosses_faithfully():
    answer = (
        "from collections import Counter, namedtuple\nfrom fractions import Fraction\n"
        "P = namedtuple('P', 'x y')\n"
        "LIMIT = 10\n"
        "def f(kind):\n"
        "    return {'tuple': (1, 2), 'set': {1, 2}, 'keys': {1: 'a', (2, 3): b'x'}, 'nan': float('nan'),\n"
        "            'counter': Counter('aab'), 'named': P(1, 2), 'frac': Fraction(1, 2), 'gen': (i for i in range(3)),\n"
        "            'complex': 1 + 2j, 'big': 7 ** 5000, 'none': None, 'range': range(3)}[kind]\n"
        "def sort_in_place(xs):\n    xs.sort()\n"
        "def fail(x):\n    raise ValueError('bad %d' % x)\n"
    )
    tests = (
        "import math\n"
        "assert f('tuple') == (1, 2) and type(f('tuple')) is tuple\n"
        "assert f('set') == {1, 2} and f('keys') == {1: 'a', (2, 3): b'x'}\n"
        "assert math.isnan(f('nan'))\n"
        "assert f('counter') == {'a': 2, 'b': 1} and f('named') == (1, 2) and f('frac') == 0.5\n"
        "assert list(f('gen')) == [0, 1, 2] and f('complex') == 1 + 2j and f('big') == 7 ** 5000\n"
        "assert f('none') is None and f('range') == range(3) and LIMIT == 10\n"
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]\n"
        "try:\n    fail(3)\n    raise AssertionError('no exception')\nexcept ValueError as e:\n    assert str(e) == 'bad 3'\n"
    )
    (g,) = grade_all([(answer, tests)])
    assert g.passed, g.run.stderr


def test_answers_own_objects_do_not_cross():
    (g,) = grade_all([("class C:\n    pass\ndef add(a, b):\n    return C()\n", None)])
    assert not g.passed and "a value of type C cannot cross" in g.run.stderr


def _traj(answer: str) -> Trajectory:
    msg = Message(role="assistant", content=answer)
    return Trajectory(
        id="t", turns=[Turn(prompt_ids=[1], action_ids=[2], action_logprobs=[-0.1], action=msg)]
    )


def test_accuracy_reward_grades_code_and_passes_the_weak_isolation_flag(monkeypatch):
    task = Task(id="t", prompt="p", answer=None, metadata={"answer_type": "code", "tests": TESTS})
    reward = AccuracyReward()
    assert reward.score(_traj(f"<answer>```python\n{CORRECT}```</answer>"), task) == 1.0
    assert reward.score(_traj("<answer>def add(a, b):\n    return 0\n</answer>"), task) == 0.0
    seen = {}

    async def recording_run_code_tests(code, tests, **kwargs):
        seen.update(kwargs)
        return True

    monkeypatch.setattr("flowgrpo.rewards.answers.run_code_tests", recording_run_code_tests)
    weak = AccuracyReward(allow_weak_isolation=True, code_timeout_s=3)
    assert weak.score(_traj("<answer>x</answer>"), task) == 1.0
    assert seen == {"timeout_s": 3, "allow_weak_isolation": True}


@pytest.mark.slow
def test_every_bundled_solution_passes_and_a_wrong_answer_fails():
    from flowgrpo.envs.coding import BUNDLED_TASKS, load_coding_jsonl

    tasks = load_coding_jsonl(BUNDLED_TASKS)
    grades = grade_all([(t.metadata["solution"], t.metadata["tests"]) for t in tasks])
    assert [t.id for t, g in zip(tasks, grades, strict=True) if not g.passed] == []
    wrong = grade_all(
        [
            (f"def {t.metadata['entry_point']}(*a, **k):\n    return None\n", t.metadata["tests"])
            for t in tasks
        ]
    )
    assert not any(g.passed for g in wrong)


# Runs as uid 65534 (test_code_sandbox.run_unprivileged): the attacks in every mode, weak included.
AS_USER_GRADING = r"""
import asyncio, json, os
from flowgrpo.rewards.code import grade_code
from flowgrpo.sandbox.python import SandboxLimits, sandbox_capabilities
caps = sandbox_capabilities()
report = {"uid": os.getuid(), "mode": caps.mode}
async def go(mode):
    limits = SandboxLimits(isolation=mode, wall_s=15, allow_weak_isolation=mode == "weak")
    sem = asyncio.Semaphore(4)
    async def one(code, tests):
        async with sem:
            return (await grade_code(code, tests or TESTS, limits=limits)).passed
    passed = await asyncio.gather(one(CORRECT, None), *(one(code, tests) for _, code, tests in ATTACKS))
    return {"correct": passed[0], "forged": [a[0] for a, p in zip(ATTACKS, passed[1:]) if p]}
for mode in MODES or [caps.mode]:
    report[mode] = asyncio.run(go(mode))
print("REPORT " + json.dumps(report))
"""


def _unprivileged_grading(modes: list[str]) -> dict:
    script = f"CORRECT = {CORRECT!r}\nTESTS = {TESTS!r}\nATTACKS = {ATTACKS!r}\nMODES = {modes!r}\n"
    rep = run_unprivileged(delegate_cgroup=False, script=script + AS_USER_GRADING)
    assert rep["uid"] == 65534
    return rep


def test_forged_verdicts_score_0_as_unprivileged_user():
    rep = _unprivileged_grading([])  # the mode this user gets by default
    assert rep["mode"] in ("bwrap", "unshare") and rep[rep["mode"]] == {"correct": True, "forged": []}, rep


@pytest.mark.slow
def test_forged_verdicts_score_0_as_unprivileged_user_in_every_mode():
    rep = _unprivileged_grading([m for m in ("bwrap", "unshare") if getattr(CAPS, m)] + ["weak"])
    for mode in ("bwrap", "unshare"):
        if mode in rep:
            assert rep[mode] == {"correct": True, "forged": []}, (mode, rep[mode])
    # weak isolation (allowed explicitly) is no boundary, but these attacks still fail there
    assert rep["weak"] == {"correct": True, "forged": []}, rep["weak"]


def test_sandbox_sees_no_project_packages():
    # the sandbox runs the base interpreter: the project's virtual environment is not importable
    r = run_python("import pydantic")
    assert r.exit_code == 1 and "ModuleNotFoundError" in r.stderr
