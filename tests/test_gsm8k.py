"""The ``gsm8k`` environment and its shipped GSM8K-format sample."""

from __future__ import annotations

import asyncio
import json
import sys
import types

import pytest
from flowgrpo.envs.gsm8k import GSM8KEnv, reasoning_of
from flowgrpo.envs.gsm8k_sample import ANNOTATION, SAMPLE_FILES, evaluate, generate, split_of

from flowgrpo.env import check_environment, make, run_oracle
from flowgrpo.types import Message, ParsedAction


def _rows(split: str) -> list[dict[str, str]]:
    return [json.loads(x) for x in SAMPLE_FILES[split].read_text(encoding="utf-8").splitlines()]


def test_shipped_sample_is_what_the_generator_writes():
    fresh = generate()
    for split in ("train", "test"):
        assert _rows(split) == fresh[split]
    assert (len(fresh["train"]), len(fresh["test"])) == (323, 77)


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_step_of_the_sample_is_right_and_the_answer_is_the_last_step(split):
    for row in _rows(split):
        assert split_of(row["question"]) == split
        reasoning, final = row["answer"].rsplit("\n#### ", 1)
        steps = ANNOTATION.findall(reasoning)
        assert len(steps) >= 2, row
        for expr, value in steps:
            assert evaluate(expr) == int(value) >= 0, (expr, value)
        assert final == steps[-1][1] and int(final) >= 0


def test_evaluate_is_plain_arithmetic_by_hand():
    assert evaluate("100*25/100") == 25 and evaluate("7-2*3") == 1 and evaluate("9/2") == 4.5
    with pytest.raises(ValueError, match="not plain arithmetic"):
        evaluate("__import__('os')")


def test_train_and_test_share_no_question():
    assert not {r["question"] for r in _rows("train")} & {r["question"] for r in _rows("test")}


def test_reasoning_drops_annotations():
    sol = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72.\n#### 72"
    assert reasoning_of(sol) == "Natalia sold 48/2 = 24 clips in May.\nAltogether 48+24 = 72."


@pytest.mark.parametrize("calculator", [False, True])
def test_check_environment_passes_and_the_oracle_solves_every_test_task(calculator):
    env = make("gsm8k", calculator=calculator)
    check_environment(env)
    assert [t.name for t in env.tools] == (["calculator"] if calculator else [])
    tasks = env.tasks("test")
    assert len(tasks) == 77 and tasks[0].id == "gsm8k-sample-test-00000"

    async def solve_all():
        return [await run_oracle(env, t) for t in tasks]

    for result, msgs in asyncio.run(solve_all()):
        assert result.terminated and result.info["correct"] is True
        calls = [m for m in msgs if m.role == "tool"]
        assert len(calls) == (1 if calculator else 0)
        assert msgs[-1].content.endswith(f"<answer>{result.info['answer']}</answer>")


def test_single_turn_by_default_and_answers_compared_by_value():
    env = GSM8KEnv()
    task = env.tasks("train")[0]

    async def episode(text: str, answer: str | None):
        await env.reset(task)
        return await env.step(ParsedAction(message=Message(role="assistant", content=text), answer=answer))

    r = asyncio.run(episode("I think it is 5.", None))  # no answer tag: the one turn is spent
    assert r.truncated and not r.terminated
    r = asyncio.run(episode(f"<answer>{task.answer}.0</answer>", f"{task.answer}.0"))
    assert r.terminated and r.info["correct"] is True
    r = asyncio.run(episode("<answer>-1</answer>", "-1"))
    assert r.info["correct"] is False


def test_limits_and_jsonl_source(tmp_path):
    assert len(GSM8KEnv(num_train=5, num_test=3).tasks("train")) == 5
    good = tmp_path / "train.jsonl"
    good.write_text(json.dumps({"question": "1+1?", "answer": "1+1=<<1+1=2>>2\n#### 2"}) + "\n\n")
    bad = tmp_path / "test.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    env = GSM8KEnv(source="jsonl", data_files={"train": str(good), "test": str(bad)})
    [t] = env.tasks("train")
    assert (t.id, t.prompt, t.answer) == ("gsm8k-jsonl-train-00000", "1+1?", "2")
    with pytest.raises(ValueError, match=r"test\.jsonl:1: not a GSM8K row"):
        env.tasks("test")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"source": "huggingface"}, r"source must be one of \['sample', 'hf', 'jsonl'\]"),
        ({"source": "jsonl"}, "needs data_files"),
        ({"data_files": {"train": "a", "test": "b"}}, "only read with source: jsonl"),
        ({"num_test": 0}, "num_test must be >= 1"),
    ],
)
def test_bad_settings_say_how_to_fix_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GSM8KEnv(**kwargs)


def test_hf_source_without_datasets_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ValueError, match=r"pip install datasets.*load_dataset\('gsm8k', 'main'\)"):
        GSM8KEnv(source="hf").tasks("test")


def _fake_datasets(monkeypatch, load):
    mod = types.ModuleType("datasets")
    mod.config = types.SimpleNamespace(HF_HUB_OFFLINE=False)
    mod.load_dataset = load
    monkeypatch.setitem(sys.modules, "datasets", mod)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return mod


def test_hf_source_reads_the_local_cache_only(monkeypatch):
    """``datasets`` itself is not installed here; what this env controls is checked: the call is
    ``load_dataset("gsm8k", "main", split=...)`` with the hub offline, and the flags come back."""
    seen = []

    def load(name, config, *, split):
        seen.append((name, config, split, mod.config.HF_HUB_OFFLINE, dict(__import__("os").environ)))
        return [{"question": "Q?", "answer": "3 * 4 = <<3*4=12>>12\n#### 1,200"}]

    mod = _fake_datasets(monkeypatch, load)
    [t] = GSM8KEnv(source="hf").tasks("test")
    assert (t.id, t.answer) == ("gsm8k-test-00000", "1200")
    name, config, split, offline, env = seen[0]
    assert (name, config, split, offline) == ("gsm8k", "main", "test", True)
    assert env["HF_HUB_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"
    assert mod.config.HF_HUB_OFFLINE is False and "HF_HUB_OFFLINE" not in __import__("os").environ


def test_hf_source_missing_from_the_cache_is_a_clear_error(monkeypatch):
    def load(name, config, *, split):
        raise ConnectionError("Couldn't reach 'gsm8k' on the Hub (LocalEntryNotFoundError)")

    _fake_datasets(monkeypatch, load)
    with pytest.raises(ValueError, match=r"not in the local datasets cache.*never downloads at run time"):
        GSM8KEnv(source="hf").tasks("train")
