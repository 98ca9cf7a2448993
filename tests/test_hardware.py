import pytest

from flowgrpo.modeling import hardware


@pytest.mark.parametrize(
    ("flags", "expected"),
    [({"avx2", "fma"}, None), ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"), ({"amx_bf16"}, "bfloat16")],
)
def test_auto_picks_bf16_only_where_it_is_native(monkeypatch, flags, expected):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    assert hardware.resolve_autocast("auto", "cpu") == expected


def test_explicit_settings_are_kept_and_slow_bf16_is_warned(monkeypatch, caplog):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2"}))
    assert hardware.resolve_autocast(None) is None
    assert hardware.resolve_autocast("bfloat16", "cpu") == "bfloat16"
    assert "emulated" in caplog.text


def test_cpu_flags_reads_this_machine():
    flags = hardware.cpu_flags()
    assert isinstance(flags, frozenset)
    assert hardware.fast_bf16("cpu") == any(f in flags for f in ("avx512_bf16", "amx_bf16"))
