import pytest

from flowgrpo.modeling import hardware


@pytest.mark.parametrize("flags", [{"avx2", "fma"}, {"avx2", "avx512f", "avx512_bf16"}, {"amx_bf16"}])
def test_auto_keeps_the_update_in_fp32_even_where_bf16_is_native(monkeypatch, flags):
    """bf16 autocast of the update took the demo's RL gain away where it is native (docs/learning.md)."""
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    assert hardware.resolve_autocast("auto", "cpu") is None


def test_explicit_settings_are_kept_and_slow_bf16_is_warned(monkeypatch, caplog):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2"}))
    assert hardware.resolve_autocast(None) is None
    assert hardware.resolve_autocast("bfloat16", "cpu") == "bfloat16"
    assert "emulated" in caplog.text


@pytest.mark.parametrize(
    ("flags", "device", "warned"),
    [
        ({"avx512_bf16"}, "cpu", True),
        ({"avx512_fp16"}, "cpu", False),
        ({"amx_fp16"}, "cpu", False),
        ({"avx2"}, "cuda", False),
    ],
)
def test_a_float16_update_on_a_cpu_without_fp16_is_warned(monkeypatch, caplog, flags, device, warned):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    assert hardware.resolve_autocast("float16", device) == "float16"
    assert ("~20x slower than fp32" in caplog.text) is warned


def test_cpu_flags_reads_this_machine():
    flags = hardware.cpu_flags()
    assert isinstance(flags, frozenset)
    assert hardware.fast_bf16("cpu") == any(f in flags for f in ("avx512_bf16", "amx_bf16"))


def test_cpu_model_and_flags_come_from_cpuinfo(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    )
    real_path = hardware.Path
    monkeypatch.setattr(
        hardware, "Path", lambda p: real_path(cpuinfo) if p == "/proc/cpuinfo" else real_path(p)
    )
    hardware.cpu_flags.cache_clear()
    try:
        assert hardware.cpu_model() == "AMD EPYC 7B13"
        assert hardware.cpu_flags() == {"fpu", "avx2", "avx512f", "avx512_bf16"}
        assert hardware.fast_bf16("cpu")
    finally:
        hardware.cpu_flags.cache_clear()


def test_auto_update_precision_is_fp32_on_cuda_until_measured():
    assert hardware.resolve_autocast("auto", "cuda") is None
    assert hardware.resolve_autocast("auto", "cuda:1") is None


@pytest.mark.parametrize(
    ("flags", "setting", "expected"),
    [
        ({"avx2"}, "auto", None),  # emulated bf16: sample the fp32 weights
        ({"avx512_bf16"}, "auto", "bfloat16"),  # native bf16: a bf16 inference copy
        ({"amx_bf16"}, "auto", "bfloat16"),
        ({"avx512_bf16"}, "float32", None),  # the weights' own dtype needs no copy
        ({"avx2"}, "float16", "float16"),
    ],
)
def test_rollout_dtype(monkeypatch, flags, setting, expected):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    assert hardware.resolve_rollout_dtype(setting, "cpu") == expected
    assert hardware.resolve_rollout_dtype("bfloat16", "cpu", weights_dtype="bfloat16") is None


def test_auto_samples_the_fp32_weights_on_cuda(monkeypatch):
    """On a GPU the bf16 copy decoded no faster than fp32 and its RL arms ended 4.9 points lower
    (docs/learning.md section 17), so ``auto`` keeps sampler and trainer identical there."""
    monkeypatch.setattr(hardware, "fast_bf16", lambda device=None: True)
    assert hardware.resolve_rollout_dtype("auto", "cuda") is None
    assert hardware.resolve_rollout_dtype("auto", "cuda:1") is None
    assert hardware.resolve_rollout_dtype("auto", "cpu") == "bfloat16"
    assert hardware.resolve_rollout_dtype("bfloat16", "cuda") == "bfloat16"  # an explicit setting is kept


def test_sampler_matches_trainer_only_in_fp32_on_both_sides():
    assert hardware.sampler_matches_trainer(None, None)
    assert not hardware.sampler_matches_trainer("bfloat16", None)
    assert not hardware.sampler_matches_trainer(None, "bfloat16")


@pytest.fixture
def cudnn_attention_flag():
    """The process-wide flag, restored after the test."""
    import torch

    was = torch.backends.cuda.cudnn_sdp_enabled()
    yield torch.backends.cuda
    torch.backends.cuda.enable_cudnn_sdp(was)


def test_cudnn_attention_is_turned_off_for_a_gpu_and_left_alone_for_a_cpu(cudnn_attention_flag):
    """cuDNN attention re-plans at every new decode length: on an H200 a bf16 copy decoded at 93 ms per
    step with it and 29 ms without it (hardware module docstring)."""
    flag = cudnn_attention_flag
    flag.enable_cudnn_sdp(True)
    assert hardware.avoid_cudnn_attention("cpu") is False
    assert hardware.avoid_cudnn_attention(None) is False
    assert flag.cudnn_sdp_enabled()
    assert hardware.avoid_cudnn_attention("cuda:0") is True
    assert not flag.cudnn_sdp_enabled()
    assert hardware.avoid_cudnn_attention("cuda") is False  # already off: nothing to do
