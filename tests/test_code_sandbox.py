"""tools/code.py: the sandbox contains hostile code; the host is unharmed and the tool still works."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading

import pytest
from flowgrpo.tools.code import CodeTool, SandboxLimits, run_python, sandbox_capabilities

from flowgrpo.tool import Tool, invoke

SMALL = SandboxLimits(
    wall_s=3, cpu_s=2, memory_mb=256, max_processes=16, file_size_mb=1, disk_mb=8, max_output_bytes=100_000
)
NS = sandbox_capabilities().namespaces


def still_works():
    r = run_python("print(6*7)", SMALL)
    assert r.stdout == "42\n" and r.exit_code == 0 and r.limit_hit is None


def test_runs_code_and_reports():
    r = run_python("import sys\nprint('hi')\nprint('err', file=sys.stderr)\nsys.exit(3)", SMALL)
    assert (r.stdout, r.stderr, r.exit_code, r.limit_hit) == ("hi\n", "err\n", 3, None)
    tool = CodeTool(SMALL)
    assert isinstance(tool, Tool) and tool.name == "python"
    out = asyncio.run(invoke(tool, {"code": "print(sum(range(10)))"}))
    assert out.content == "45" and out.artifact["exit_code"] == 0
    out = asyncio.run(invoke(tool, {"code": "1/0"}))
    assert out.content.startswith("stderr:\nTraceback") and out.content.endswith(
        "ZeroDivisionError: division by zero\nexit code 1"
    )


def test_files_and_fresh_workdir_removed():
    r = run_python(
        "import os\nprint(open('data.txt').read())\nprint(os.getcwd())", SMALL, files={"data.txt": "abc"}
    )
    assert r.stdout.startswith("abc\n")
    assert not os.path.exists(r.stdout.splitlines()[1])  # removed afterwards


def test_infinite_loop():
    r = run_python("while True:\n    pass", SMALL)
    assert r.limit_hit in ("cpu", "wall") and r.exit_code is None and r.duration_s < 4.5
    out = asyncio.run(invoke(CodeTool(SMALL), {"code": "while True: pass"}))
    assert out.content.startswith("Error: ") and "limit exceeded" in out.content
    still_works()


def test_fork_bomb():
    r = run_python("import os\nwhile True:\n    os.fork()", SMALL)
    assert r.limit_hit in ("processes", "wall", "cpu") and r.exit_code != 0
    still_works()


def test_memory_bomb():
    r = run_python("x = bytearray(2 * 1024**3)", SMALL)
    assert r.limit_hit == "memory" and "MemoryError" in r.stderr
    still_works()


def test_huge_output():
    r = run_python(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
        SMALL.model_copy(update={"output_chars": 1000}),
    )
    assert r.limit_hit == "output" and r.truncated and len(r.stdout) < 1200
    assert r.duration_s < 3
    still_works()


def test_write_outside_workdir_and_delete_host_file(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.chmod(tmp_path, 0o777)  # even a world-writable directory must stay untouched
    os.chmod(victim, 0o666)
    code = f"""
import os
for attempt in (lambda: open('/etc/flowgrpo_evil', 'w'), lambda: open({str(tmp_path)!r} + '/new.txt', 'w'),
                lambda: os.remove({str(victim)!r}), lambda: open({str(victim)!r}, 'w').write('gone')):
    try:
        attempt()
        print('ALLOWED')
    except OSError as e:
        print('blocked', e.errno)
"""
    r = run_python(code, SMALL)
    assert "ALLOWED" not in r.stdout, r.stdout
    assert r.stdout.count("blocked") == 4
    assert victim.read_text() == "keep me" and not (tmp_path / "new.txt").exists()
    assert not os.path.exists("/etc/flowgrpo_evil")


def test_parent_secrets_invisible(monkeypatch):
    monkeypatch.setenv("FLOWGRPO_SECRET_TOKEN", "s3cr3t-value")
    code = """
import os
print('FLOWGRPO_SECRET_TOKEN' in os.environ)
found = False
for pid in os.listdir('/proc'):
    try:
        found |= b's3cr3t-value' in open(f'/proc/{pid}/environ', 'rb').read()
    except OSError:
        pass
print(found)
"""
    r = run_python(code, SMALL)
    assert r.stdout == "False\nFalse\n", r


def test_network_blocked():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    accepted = []

    def accept():
        srv.settimeout(3)
        with contextlib.suppress(OSError):
            accepted.append(srv.accept())

    th = threading.Thread(target=accept)
    th.start()
    code = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e)"
    r = run_python(code, SMALL)
    th.join()
    srv.close()
    assert r.stdout.startswith("blocked") and not accepted


def test_background_process_does_not_outlive_call(tmp_path):
    code = """
import os, subprocess, sys, time
p = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.05)'], start_new_session=True)
print(p.pid, flush=True)
"""
    r = run_python(code, SMALL)
    assert r.exit_code == 0
    # nothing of the sandbox uid, or named like the sleeper, is left on the host
    import time

    time.sleep(0.2)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            assert b"while True: time.sleep(0.05)" not in cmd
    still_works()


@pytest.mark.skipif(not NS, reason="needs namespaces")
def test_disk_and_file_size_limits():
    r = run_python("open('big', 'wb').write(b'x' * 2 * 1024**2)", SMALL)
    assert r.limit_hit == "file_size"
    r = run_python("for i in range(20):\n    open(f'f{i}', 'wb').write(b'x' * 900_000)", SMALL)
    assert r.limit_hit == "disk"
    still_works()


def test_capabilities_reported():
    caps = sandbox_capabilities()
    assert caps.mode in ("namespaces", "rlimits")
    assert (caps.missing == []) == (caps.namespaces and caps.drop_uid)
