"""Built-in environments: conformance, generators, loaders, and oracles through the real tools."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from flowgrpo.envs.arithmetic import LEVELS, ArithmeticEnv, generate_problem, parse_gsm8k_answer
from flowgrpo.envs.coding import BUNDLED_TASKS, CodingEnv, load_coding_jsonl
from flowgrpo.envs.multihop import QUESTIONS, MultihopEnv, extract_fact
from flowgrpo.tools.calculator import Calculator

from flowgrpo.env import check_environment, make, run_oracle

BUILTINS = ["arithmetic", "multihop", "coding"]


def solve_rate(env, tasks) -> tuple[float, list[str]]:
    async def go():
        out = []
        for t in tasks:
            r, msgs = await run_oracle(env, t)
            out.append((bool(r.info.get("correct")), t, msgs))
        return out

    res = asyncio.run(go())
    failures = [
        f"{t.id}: {t.prompt[:80]!r} gold={t.answer!r} last={msgs[-1].content[:120]!r}"
        for ok, t, msgs in res
        if not ok
    ]
    return sum(ok for ok, _, _ in res) / len(res), failures


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_passes_check_environment(name: str) -> None:
    env = make(name)
    check_environment(env)  # determinism across instances via env.spec, splits disjoint, ...
    tr, te = env.tasks("train"), env.tasks("test")
    assert {t.prompt for t in tr}.isdisjoint({t.prompt for t in te})


@pytest.mark.parametrize(("name", "n"), [("arithmetic", 60), ("multihop", 60), ("coding", 4)])
def test_oracle_solves_a_sample_through_the_tools(name: str, n: int) -> None:
    env = make(name)
    rate, failures = solve_rate(env, env.tasks("test")[:n])
    assert rate == 1.0, failures


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTINS)
def test_oracle_solves_99_percent_of_the_test_split(name: str) -> None:
    env = make(name)
    rate, failures = solve_rate(env, env.tasks("test"))
    assert rate >= 0.99, failures[:5]


# --- arithmetic --------------------------------------------------------------------------------


def test_arithmetic_default_difficulty_is_small() -> None:
    env = ArithmeticEnv(num_train=300, num_test=50)
    assert len(env.system_prompt) < 150
    for t in env.tasks("train") + env.tasks("test"):
        operands = [int(x) for x in re.findall(r"\d+", t.metadata["expression"])]
        assert all(x < 100 for x in operands), t
        assert 1 <= t.metadata["num_ops"] <= 3
        assert re.fullmatch(r"\d+", t.answer)  # non-negative integer
        assert len(t.prompt) < 260


def test_arithmetic_expression_matches_answer_with_the_real_calculator() -> None:
    calc = Calculator()
    for level in (1, 2, 3):
        env = ArithmeticEnv(difficulty=level, num_train=20, num_test=20, seed=7)
        for t in env.tasks("test"):
            args = calc.args_schema(expression=t.metadata["expression"])
            assert asyncio.run(calc.run(args)) == t.answer


def test_arithmetic_difficulty_knobs_and_seeds() -> None:
    import random

    rng = random.Random(1)
    hard = [generate_problem(rng, LEVELS[3]) for _ in range(50)]
    assert max(v for _, _, v in hard) > 1000
    env = ArithmeticEnv(num_ops=(4, 4), max_number=20, num_train=30, num_test=10)
    assert all(t.metadata["num_ops"] == 4 for t in env.tasks("train"))
    assert ArithmeticEnv(seed=1, num_train=5, num_test=5).tasks("train") != ArithmeticEnv(
        seed=2, num_train=5, num_test=5
    ).tasks("train")
    with pytest.raises(ValueError, match="difficulty"):
        ArithmeticEnv(difficulty=9)


def test_arithmetic_level_mix() -> None:
    env = ArithmeticEnv(difficulty=[1, 2], num_train=200, num_test=50)
    tasks = env.tasks("train") + env.tasks("test")
    by_level = {d: [t for t in tasks if t.metadata["level"] == d] for d in (1, 2)}
    assert 80 <= len(by_level[1]) <= 170 and len(by_level[1]) + len(by_level[2]) == 250  # about half each
    assert all(max(int(x) for x in re.findall(r"\d+", t.metadata["expression"])) < 100 for t in by_level[1])
    assert all(2 <= t.metadata["num_ops"] <= 4 for t in by_level[2])
    assert max(int(t.answer) for t in by_level[2]) > 999  # level 2's bigger numbers
    # one level draws no level from the generator: the tasks (and every held-out set) are the same
    single = ArithmeticEnv(num_train=3, num_test=3)
    assert single.tasks("test")[0].prompt.startswith("Fay has 63 toy cars. Then she has 4 times as many.")
    assert all(t.metadata["level"] == 1 for t in single.tasks("train"))
    with pytest.raises(ValueError, match="non-empty list"):
        ArithmeticEnv(difficulty=[])
    with pytest.raises(ValueError, match="difficulty"):
        ArithmeticEnv(difficulty=[1, 7])


def test_gsm8k_loader(tmp_path) -> None:
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "A car costs $1,200 and a bike $300. Total?", "answer": "1200+300=1500\n#### 1,500"},
    ]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text(
            "\n".join(json.dumps(r) for r in rows[: 1 if split == "train" else 2])
        )
    env = ArithmeticEnv(
        data_files={"train": str(tmp_path / "train.jsonl"), "test": str(tmp_path / "test.jsonl")}
    )
    test = env.tasks("test")
    assert [t.answer for t in test] == ["7", "1500"]
    assert parse_gsm8k_answer("so #### -3") == "-3"
    with pytest.raises(ValueError, match="####"):
        parse_gsm8k_answer("no marker")
    rate, failures = solve_rate(env, test)
    assert rate == 1.0, failures


# --- multihop ------------------------------------------------------------------------------------


def test_multihop_questions_cover_1_to_3_hops_and_answers_follow_the_kb() -> None:
    env = MultihopEnv()
    tasks = env.tasks("train") + env.tasks("test")
    assert {t.metadata["hops"] for t in tasks} == {1, 2, 3}
    for t in tasks[:100]:
        assert env.kb.follow(t.metadata["subject"], tuple(t.metadata["chain"])) == t.answer
    assert {len(c) for c, _, _ in QUESTIONS} == {1, 2, 3}
    only2 = MultihopEnv(hops=(2,), num_train=50, num_test=10)
    assert {t.metadata["hops"] for t in only2.tasks("train")} == {2}


def test_multihop_chains_keep_some_questions_in_the_splits_they_had() -> None:
    full = MultihopEnv(hops=(1, 2))
    pairs = MultihopEnv(hops=(1, 2), chains=["born_city", "born_city > country", "hq", "hq>country"])
    wanted = {("born_city",), ("born_city", "country"), ("hq",), ("hq", "country")}
    for split in ("train", "test"):
        kept = [t for t in full.tasks(split) if tuple(t.metadata["chain"]) in wanted]
        assert pairs.tasks(split) == kept and kept  # same order, ids, prompts and metadata
    with pytest.raises(ValueError, match="born_city > country"):
        MultihopEnv(hops=(1, 2), chains=["born_city > city"])
    with pytest.raises(ValueError, match="chains of hops"):
        MultihopEnv(hops=(1,), chains=["born_city > country"])


def test_multihop_first_hop_pairs_the_questions_that_start_with_the_same_search() -> None:
    from flowgrpo.algorithms.curriculum import CurriculumConfig, PairedStream, make_sampler

    train = MultihopEnv(hops=(1, 2)).tasks("train")
    s = make_sampler(CurriculumConfig(pair_by="first_hop"), train, 0)
    assert isinstance(s, PairedStream)
    prompts = {t.prompt for t in train}
    person = next(
        p
        for p in MultihopEnv().kb.people
        if {f"In which city was {p} born?", f"In which country was {p} born?"} <= prompts
    )
    assert sorted(t.prompt for t in s.partners[f"{person} > born_city"]) == [
        f"In which city was {person} born?",
        f"In which country was {person} born?",
    ]
    for t in s.partners[f"{person} > born_city"]:
        assert t.metadata["first_hop"] == [person, "born_city"] and t.metadata["subject"] == person


def test_multihop_documents_hold_every_fact() -> None:
    env = MultihopEnv(num_people=20, num_orgs=8, num_cities=6, num_countries=3, num_train=50, num_test=10)
    text = " ".join(d["text"] for d in env.documents())
    for (subject, rel), obj in env.kb.facts.items():
        assert extract_fact(text, subject, rel) == obj


def test_multihop_f1_in_info() -> None:
    async def go():
        env = MultihopEnv()
        task = next(t for t in env.tasks("test") if len(t.answer.split()) >= 2)
        await env.reset(task)
        first = task.answer.split()[0]
        return task, await env.step(env.parser.parse(f"<answer>{first}</answer>"))

    task, r = asyncio.run(go())
    n = len(task.answer.split())
    assert r.info["correct"] is False
    assert r.info["f1"] == pytest.approx(2 * (1 / n) / (1 + 1 / n))


# --- coding -------------------------------------------------------------------------------------


def test_coding_bundle_has_30_plus_tasks() -> None:
    tasks = load_coding_jsonl(BUNDLED_TASKS)
    assert len(tasks) >= 30
    assert all(t.metadata["tests"].count("assert") >= 2 for t in tasks)


def test_coding_wrong_answer_fails_hidden_tests() -> None:
    async def go():
        env = CodingEnv()
        task = next(t for t in env.tasks("test"))
        await env.reset(task)
        entry = task.metadata["entry_point"]
        return await env.step(
            env.parser.parse(f"<answer>```python\ndef {entry}(*a):\n    return None\n```</answer>")
        )

    r = asyncio.run(go())
    assert r.terminated and r.info["correct"] is False


def test_humaneval_and_mbpp_loaders(tmp_path) -> None:
    he = {
        "task_id": "HumanEval/0",
        "prompt": 'def inc(x):\n    """Return x + 1."""\n',
        "canonical_solution": "    return x + 1\n",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n",
        "entry_point": "inc",
    }
    mbpp = {
        "task_id": 11,
        "text": "Write a function to double a number.",
        "code": "def double(x):\n    return 2 * x",
        "test_list": ["assert double(2) == 4", "assert double(0) == 0"],
    }
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(he) + "\n" + json.dumps(mbpp) + "\n")
    tasks = load_coding_jsonl(path)
    assert [t.id for t in tasks] == ["coding-HumanEval-0", "coding-11"]
    assert tasks[1].metadata["entry_point"] == "double"
    assert "check(inc)" in tasks[0].metadata["tests"]
    env = CodingEnv(data_files=str(path), test_fraction=0.5)
    rate, failures = solve_rate(env, tasks)
    assert rate == 1.0, failures
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(ValueError, match="HumanEval"):
        load_coding_jsonl(bad)


@pytest.mark.slow
def test_every_bundled_reference_solution_passes_its_hidden_tests() -> None:
    env = CodingEnv()
    rate, failures = solve_rate(env, env.tasks("train") + env.tasks("test"))
    assert rate == 1.0, failures
