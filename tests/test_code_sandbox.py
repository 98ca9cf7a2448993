"""The code sandbox (flowgrpo.sandbox.python, the `python` tool of tools/code.py): hostile code is contained,
as root and as an unprivileged user, in every isolation mode this host has; the tool still works."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
import uuid

import pytest
from flowgrpo.tools.code import CodeTool, SandboxLimits, run_python, sandbox_capabilities

from flowgrpo.sandbox import cgroup
from flowgrpo.sandbox.python import (
    SandboxUnavailableError,
    arun_python,
    choose_isolation,
    probe_isolation,
    remove_stale,
)
from flowgrpo.tool import Tool, invoke

SMALL = SandboxLimits(
    wall_s=3, cpu_s=2, memory_mb=256, max_processes=16, file_size_mb=1, disk_mb=8, max_output_bytes=100_000
)
CAPS = sandbox_capabilities()
NS = CAPS.namespaces


def still_works():
    r = run_python("print(6*7)", SMALL)
    assert r.stdout == "42\n" and r.exit_code == 0 and r.limit_hit is None


def test_runs_code_and_reports():
    r = run_python("import sys\nprint('hi')\nprint('err', file=sys.stderr)\nsys.exit(3)", SMALL)
    assert (r.stdout, r.stderr, r.exit_code, r.limit_hit) == ("hi\n", "err\n", 3, None)
    assert r.mode == CAPS.mode and r.weak_isolation == (CAPS.mode == "weak")
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
    assert not os.path.exists(r.stdout.splitlines()[1])  # removed afterwards (or never on the host)


def test_infinite_loop():
    r = run_python("while True:\n    pass", SMALL)
    assert r.limit_hit in ("cpu", "wall") and r.exit_code is None and r.duration_s < 4.5
    out = asyncio.run(invoke(CodeTool(SMALL), {"code": "while True: pass"}))
    assert out.content.startswith("Error: ") and "limit exceeded" in out.content
    still_works()


def test_fork_bomb():
    r = run_python("import os\nwhile True:\n    os.fork()", SMALL)
    assert r.exit_code != 0
    if CAPS.cgroup:
        assert r.limit_hit == "processes"  # from the cgroup's pids.events, not from the traceback
    still_works()


def test_memory_bomb():
    r = run_python("x = b'x' * (2 * 1024**3)", SMALL)
    if CAPS.cgroup:
        assert r.limit_hit == "memory" and r.signal == signal.SIGKILL and r.per_process_limits == []
        assert r.peak_memory_mb is not None and r.peak_memory_mb <= SMALL.memory_mb + 0.5
    else:
        assert "MemoryError" in r.stderr and r.per_process_limits == ["memory"]
    still_works()


@pytest.mark.skipif(not CAPS.cgroup, reason="no cgroup can be created on this host: memory is per process")
def test_memory_is_bounded_per_call_not_per_process():
    # 8 processes of 100 MB each would pass a 256 MB per-process limit; the call's limit stops them
    code = textwrap.dedent(
        """
        import os
        kids = []
        for i in range(8):
            pid = os.fork()
            if pid == 0:
                x = b'x' * (100 * 2**20)
                import time; time.sleep(0.5)
                os._exit(0)
            kids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]
        print(codes)
        raise SystemExit(1 if any(codes) else 0)
        """
    )
    r = run_python(code, SMALL.model_copy(update={"wall_s": 20}))
    assert r.limit_hit == "memory" and "-9" in r.stdout, r
    assert r.peak_memory_mb <= SMALL.memory_mb + 0.5
    # shared memory and memfds are charged to the call too
    r = run_python("import os\nfd = os.memfd_create('m')\nos.write(fd, b'x' * (400 * 2**20))", SMALL)
    assert r.limit_hit == "memory", r


def test_sandbox_is_the_oom_killers_first_choice():
    r = run_python("print(open('/proc/self/oom_score_adj').read().strip())", SMALL)
    assert r.stdout == "1000\n"


def test_classification_comes_from_the_kernel_not_from_printed_text():
    fake = "import sys\nprint('MemoryError Resource temporarily unavailable No space left on device File too large', file=sys.stderr)\nsys.exit(1)"
    r = run_python(fake, SMALL)
    assert r.exit_code == 1 and r.limit_hit is None
    r = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", SMALL)
    assert r.signal == signal.SIGKILL and r.limit_hit is None  # a SIGKILL without an OOM kill is not "memory"


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


def _procs_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                continue
    return found


def _wait_until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _sleeper(marker: str) -> str:
    # a process in a new session, named by the marker, that would run for a minute
    return (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}], start_new_session=True)\n"
        "time.sleep(60)\n"
    )


def _leftovers(pid: int) -> list[str]:
    import tempfile

    found = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"{cgroup.PREFIX}{pid}-")]
    parents = cgroup.find_parents()
    if parents:
        for d in {parents.memory, parents.pids}:
            found += [n for n in os.listdir(d) if n.startswith(f"{cgroup.PREFIX}{pid}-")]
    return found


def test_background_process_does_not_outlive_call():
    marker = f"flowgrpo-bg-{uuid.uuid4().hex[:8]}"
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}], start_new_session=True)\n"
    r = run_python(code, SMALL)
    assert r.exit_code == 0
    assert _wait_until(lambda: not _procs_with(marker), 2.0)
    still_works()


def test_cancelled_call_leaves_nothing():
    marker = f"flowgrpo-cancel-{uuid.uuid4().hex[:8]}"

    async def main():
        task = asyncio.ensure_future(arun_python(_sleeper(marker), SMALL.model_copy(update={"wall_s": 30})))
        assert await asyncio.to_thread(_wait_until, lambda: bool(_procs_with(marker)))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(task, 0.01)

    asyncio.run(main())
    assert _wait_until(lambda: not _procs_with(marker), 3.0), _procs_with(marker)
    assert _wait_until(lambda: not _leftovers(os.getpid()), 3.0), _leftovers(os.getpid())


def test_sigkilled_trainer_leaves_nothing():
    marker = f"flowgrpo-kill-{uuid.uuid4().hex[:8]}"
    trainer = (
        "from flowgrpo.sandbox.python import SandboxLimits, run_python\n"
        f"run_python({_sleeper(marker)!r}, SandboxLimits(wall_s=30, isolation={CAPS.mode!r}, allow_weak_isolation=True))\n"
    )
    p = subprocess.Popen([sys.executable, "-c", trainer])
    try:
        assert _wait_until(lambda: bool(_procs_with(marker)), 10.0), "the sandbox never started"
    finally:
        p.kill()
        p.wait()
    # PR_SET_PDEATHSIG / --die-with-parent and the pid namespace take the whole sandbox down
    assert _wait_until(lambda: not _procs_with(marker), 3.0), _procs_with(marker)
    remove_stale()  # what the next sandbox user does at start-up: the cgroup (and weak-mode dir) go
    assert _leftovers(p.pid) == []


def test_stale_directories_and_cgroups_are_removed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{cgroup.PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{cgroup.PREFIX}{os.getpid()}-abc"
    for d in (stale, live):
        (d / "work").mkdir(parents=True)
    assert remove_stale(str(tmp_path)) >= 1
    assert not stale.exists() and live.exists()
    parents = cgroup.find_parents()
    if parents is not None:
        group = cgroup.CallCgroup(parents, memory_bytes=2**26, max_pids=4)
        renamed = [
            d.replace(f"{cgroup.PREFIX}{os.getpid()}-", f"{cgroup.PREFIX}{dead.pid}-") for d in group.dirs
        ]
        for a, b in zip(group.dirs, renamed, strict=True):
            os.rename(a, b)
        assert cgroup.remove_stale(parents) == len(renamed)
        assert not any(os.path.exists(d) for d in renamed)


def test_refuses_weak_isolation_unless_allowed(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    caps = probe_isolation(str(fake), None)  # a bwrap that does not work, and no unshare
    assert caps.mode == "weak" and caps.bwrap is None and caps.unshare is None
    assert any("network namespace" in m for m in caps.missing)
    assert probe_isolation(str(tmp_path / "absent"), None).mode == "weak"
    with pytest.raises(SandboxUnavailableError, match=r"bubblewrap.*allow_weak_isolation=True"):
        choose_isolation(SandboxLimits(), caps)
    assert choose_isolation(SandboxLimits(allow_weak_isolation=True), caps) == "weak"
    with pytest.raises(SandboxUnavailableError, match="isolation='bwrap' does not work here"):
        choose_isolation(SandboxLimits(isolation="bwrap"), caps)
    with pytest.raises(ValueError, match="allow_weak_isolation"):
        SandboxLimits(isolation="weak")
    if CAPS.bwrap and CAPS.unshare:
        assert CAPS.mode == "bwrap"  # bwrap is preferred when both work


@pytest.mark.skipif(not NS, reason="needs namespaces")
def test_disk_and_file_size_limits():
    r = run_python("open('big', 'wb').write(b'x' * 2 * 1024**2)", SMALL)
    assert r.limit_hit == "file_size"
    r = run_python("for i in range(20):\n    open(f'f{i}', 'wb').write(b'x' * 900_000)", SMALL)
    assert r.limit_hit == "disk"
    still_works()


def test_capabilities_reported():
    assert CAPS.mode in ("bwrap", "unshare", "weak")
    assert (CAPS.cgroup is None) == any("per-call memory" in m for m in CAPS.missing)
    assert CAPS.cpu_share == (not any("per-call CPU share" in m for m in CAPS.missing))
    assert CAPS.private_keyrings == (not any("private kernel keyrings" in m for m in CAPS.missing))
    assert SandboxLimits().cpus == 1.0  # docs/tools.md states this default


# ------------------------------------------------------------------------------------------------
# Attacks from issue 14, in every isolation mode this host has, as root and as an unprivileged uid.

MODES = [m for m in ("bwrap", "unshare") if getattr(CAPS, m)]

# Runs inside the sandbox: each attack prints "ALLOWED ..." when it worked, "blocked ..." otherwise.
ATTACKS = r"""
import ctypes, json, os, socket, sys
P = json.load(open("params.json"))
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def attempt(name, fn):
    try:
        r = fn()
        out[name] = "ALLOWED" + ("" if r is None else " " + str(r)[:40])
    except Exception as e:
        out[name] = "blocked " + type(e).__name__
def write(path):
    with open(path, "a") as f:
        f.write("x")
def remount_and_write():
    if libc.mount(None, b"/", None, 32 | 4096, None) != 0:  # MS_REMOUNT | MS_BIND, i.e. read-write
        raise OSError(ctypes.get_errno(), "remount")
    write(P["etc_file"])
def in_new_userns(fn):
    # an unprivileged user namespace gives all capabilities there: try the remount from inside it
    pid = os.fork()
    if pid == 0:
        try:
            if libc.unshare(0x10000000 | 0x20000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
                os._exit(3)
            fn()
            os._exit(0)
        except BaseException:
            os._exit(4)
    _, st = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(st) != 0:
        raise PermissionError("exit %d" % os.waitstatus_to_exitcode(st))
def unmount_home():
    if libc.umount2(P["home"].encode(), 2) != 0 and libc.umount2(b"/home", 2) != 0:
        raise OSError(ctypes.get_errno(), "umount")
    return open(P["secret"]).read()
def connect(addr):
    s = socket.socket(socket.AF_INET)
    s.settimeout(1)
    s.connect(addr)
def connect_unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
attempt("write_project", lambda: write(P["project"] + "/evil-" + P["marker"]))
attempt("append_project_file", lambda: write(P["project_file"]))
attempt("write_venv", lambda: write(P["venv"] + "/evil-" + P["marker"] + ".pth"))
attempt("write_home_rc", lambda: write(P["home"] + "/.bashrc"))
attempt("read_secret", lambda: open(P["secret"]).read())
attempt("read_project_file", lambda: open(P["project_file"]).read())
if P.get("task_data"):
    attempt("read_task_data", lambda: open(P["task_data"]).read()[:10])
attempt("read_etc_passwd", lambda: open("/etc/passwd").read()[:10])
if P.get("world_file"):
    attempt("read_world_readable_file", lambda: open(P["world_file"]).read())
attempt("remount_rw", remount_and_write)
attempt("remount_rw_in_userns", lambda: in_new_userns(remount_and_write))
attempt("unmount_to_reveal_home", unmount_home)
attempt("unmount_in_userns", lambda: in_new_userns(unmount_home))
attempt("loopback", lambda: connect(("127.0.0.1", P["port"])))
if P.get("unix"):
    attempt("host_unix_socket", lambda: connect_unix(P["unix"]))
# private /tmp and /dev/shm: writing is fine, the host must not see it (checked by the test)
attempt("tmp_private", lambda: write("/tmp/" + P["marker"]))
attempt("shm_private", lambda: write("/dev/shm/" + P["marker"]))
print(json.dumps(out))
"""


def _listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.05)
    return srv


def _accepted(srv) -> bool:
    try:
        srv.accept()
        return True
    except OSError:
        return False


def _read(path: str) -> bytes | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def _host_side_clean(marker: str, params: dict) -> list[str]:
    """What an attack left on the host (empty when contained)."""
    left = []
    for p in (
        f"/tmp/{marker}",
        f"/dev/shm/{marker}",
        params["project"] + "/evil-" + marker,
        params["venv"] + "/evil-" + marker + ".pth",
    ):
        if os.path.exists(p):
            left.append(p)
            os.remove(p)
    return left


@pytest.mark.parametrize("mode", MODES)
def test_attacks_contained_as_root(mode, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("this test runs the attacks as the root caller; the unprivileged test covers users")
    marker = f"flowgrpo-attack-{uuid.uuid4().hex[:8]}"
    secret = f"/root/{marker}-secret"
    with open(secret, "w") as f:
        f.write("ssh-private-key")
    os.chmod(secret, 0o600)
    rc = "/root/.bashrc"
    rc_before = _read(rc)
    project = os.getcwd()
    project_file = os.path.join(project, "pyproject.toml")
    before = _read(project_file)
    srv = _listener()
    unix_path = f"/run/{marker}.sock"
    usrv = socket.socket(socket.AF_UNIX)
    usrv.bind(unix_path)
    usrv.listen(1)
    params = {
        "marker": marker,
        "project": project,
        "project_file": project_file,
        "venv": sysconfig.get_paths()["purelib"],
        "home": "/root",
        "secret": secret,
        "etc_file": f"/etc/{marker}",
        "port": srv.getsockname()[1],
        "unix": unix_path,
        "task_data": os.path.join(project, "envs", "data", "coding_tasks.jsonl"),
        "world_file": f"/var/tmp/{marker}-world-readable",
    }
    with open(params["world_file"], "w") as f:
        f.write("another user's notes")
    os.chmod(params["world_file"], 0o644)
    try:
        r = run_python(
            ATTACKS, SMALL.model_copy(update={"isolation": mode}), files={"params.json": json.dumps(params)}
        )
        connected = _accepted(srv)
    finally:
        srv.close()
        usrv.close()
        os.remove(unix_path)
        os.remove(secret)
        os.remove(params["world_file"])
    assert r.exit_code == 0, r
    out = json.loads(r.stdout)
    allowed = {k: v for k, v in out.items() if v.startswith("ALLOWED") and not k.endswith("_private")}
    assert not allowed, allowed
    assert not connected and not os.path.exists(params["etc_file"])
    assert _host_side_clean(marker, params) == []
    assert _read(project_file) == before and _read(rc) == rc_before


# Runs as root in a private mount namespace (`unshare --mount`): makes the interpreter reachable for
# an unprivileged uid (here it lives under /root, mode 0700), gives that uid a home with a key, a
# shell rc file and a project with a venv, optionally delegates a cgroup to it, then becomes it and
# runs the sandbox from there.
HARNESS = r"""
import ctypes, json, os, sys
uid = 65534
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
def mount(src, tgt, fs, flags, data):
    e = lambda s: s.encode() if isinstance(s, str) else s
    if libc.mount(e(src), e(tgt), e(fs), flags, e(data)) != 0:
        raise OSError(ctypes.get_errno(), "mount " + tgt)
fds = {p: os.open(p, os.O_PATH) for p in cfg["needed"]}
for d in cfg["closed"] + ["/home"]:
    mount("tmpfs", d, "tmpfs", 0, "mode=0755")
for p, fd in fds.items():
    os.makedirs(p, exist_ok=True)
    mount("/proc/self/fd/%d" % fd, p, None, 4096 | 16384, None)
home = "/home/user"
files = {".ssh/id_rsa": "ssh-private-key", ".bashrc": "# rc\n", "project/code.py": "x = 1\n",
         "project/.venv/lib/site.py": "# venv\n"}
for rel, text in files.items():
    p = os.path.join(home, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text)
for root, dirs, names in os.walk(home):
    for n in [root] + [os.path.join(root, x) for x in names]:
        os.chown(n, uid, uid)
os.chmod(home + "/.ssh/id_rsa", 0o600)
for d in cfg["delegate"]:
    for n in ("", "cgroup.procs", "tasks"):
        if os.path.exists(os.path.join(d, n)):
            os.chown(os.path.join(d, n), uid, uid)
    with open(os.path.join(d, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
env = {"HOME": home, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
os.execve(sys.executable, [sys.executable, "-c", cfg["script"]], env)
"""

# Runs as the unprivileged uid: every mode's attacks and limits, reported as JSON.
AS_USER = r"""
import json, os, sys, uuid
from flowgrpo.sandbox.python import SandboxLimits, SandboxUnavailableError, run_python, sandbox_capabilities
P = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
caps = sandbox_capabilities()
home = os.environ["HOME"]
report = {"uid": os.getuid(), "caps": caps.model_dump()}
L = dict(wall_s=5, cpu_s=3, memory_mb=256, max_processes=16, file_size_mb=1, disk_mb=8, max_output_bytes=100_000)
for mode in [m for m in ("bwrap", "unshare") if getattr(caps, m)] + ["weak"]:
    marker = "flowgrpo-attack-" + uuid.uuid4().hex[:8]
    params = {"marker": marker, "project": home + "/project", "project_file": home + "/project/code.py",
              "venv": home + "/project/.venv/lib", "home": home, "secret": home + "/.ssh/id_rsa",
              "etc_file": "/etc/" + marker, "port": PORT, "task_data": TASK_DATA}
    limits = SandboxLimits(**L, isolation=mode, allow_weak_isolation=mode == "weak")
    r = run_python(ATTACKS, limits, files={"params.json": json.dumps(params)})
    if mode == "weak":  # no pid namespace: a fork bomb would run to the wall clock
        report[mode] = {"attacks": json.loads(r.stdout), "weak_isolation": r.weak_isolation,
                        "per_process_limits": r.per_process_limits}
        continue
    fork = run_python("import os\nwhile True:\n    os.fork()", limits)
    fork_procs = run_python("import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
                            "            import time; time.sleep(1); os._exit(0)\n        n += 1\n"
                            "except OSError:\n    print(n)", limits)
    mem = run_python("import os\nfor i in range(4):\n    if os.fork() == 0:\n        x = b'x' * (200 * 2**20)\n"
                     "        os._exit(0)\nbad = [os.wait()[1] for i in range(4)]\nprint('done')\nraise SystemExit(any(bad))", limits)
    host = [p for p in ("/tmp/" + marker, "/dev/shm/" + marker, home + "/project/evil-" + marker,
                        home + "/project/.venv/lib/evil-" + marker + ".pth") if os.path.exists(p)]
    report[mode] = {
        "attacks": json.loads(r.stdout) if r.exit_code == 0 else r.model_dump(),
        "weak_isolation": r.weak_isolation,
        "per_process_limits": r.per_process_limits,
        "host_files_left": host,
        "rc_intact": open(home + "/.bashrc").read() == "# rc\n",
        "code_intact": open(home + "/project/code.py").read() == "x = 1\n",
        "fork_bomb": {"limit_hit": fork.limit_hit, "duration_s": round(fork.duration_s, 2)},
        "processes_started": fork_procs.stdout.strip(),
        "memory_4x200mb": {"limit_hit": mem.limit_hit, "stdout": mem.stdout.strip(),
                           "peak_memory_mb": mem.peak_memory_mb, "signal": mem.signal},
    }
try:
    run_python("print(1)", SandboxLimits(isolation="weak"))
except Exception as e:
    report["weak_without_consent"] = type(e).__name__
print("REPORT " + json.dumps(report))
"""


def run_unprivileged(delegate_cgroup: bool, script: str | None = None) -> dict:
    """Run ``script`` (default: the attacks of AS_USER) as uid 65534 (see HARNESS); returns the dict
    it printed after ``REPORT ``."""
    from flowgrpo.sandbox import cgroup as cg
    from flowgrpo.sandbox.python import _view

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and util-linux unshare to switch to an unprivileged uid for the test")
    srv = _listener()
    delegated: list[str] = []
    parents = cg.find_parents()
    if delegate_cgroup:
        if parents is None or parents.version != 1:
            pytest.skip("delegating a cgroup is tested on cgroup v1 hosts only")
        name = f"{cg.PREFIX}delegated-{uuid.uuid4().hex[:6]}"
        delegated = sorted(
            {os.path.join(parents.memory, name), os.path.join(parents.pids, name)}
            | ({os.path.join(parents.cpu, name)} if parents.cpu else set())
        )
        for d in delegated:
            os.mkdir(d)
    view = _view()
    task_data = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "envs", "data", "coding_tasks.jsonl"
    )
    script = (
        script
        or f"ATTACKS = {ATTACKS!r}\nPORT = {srv.getsockname()[1]}\nTASK_DATA = {task_data!r}\n" + AS_USER
    )
    needed = sorted(
        {
            os.path.realpath(p)
            for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)))
        }
    )
    cfg = {"needed": needed, "closed": list(view.closed), "delegate": delegated, "script": script}
    try:
        p = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                sys.executable,
                "-c",
                HARNESS,
                json.dumps(cfg),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )
        connected = _accepted(srv)
    finally:
        srv.close()
        for d in delegated:  # its children were removed by the sandbox; the harness process is gone
            for sub in os.listdir(d):
                if os.path.isdir(os.path.join(d, sub)):
                    os.rmdir(os.path.join(d, sub))
            os.rmdir(d)
    line = [x for x in p.stdout.splitlines() if x.startswith("REPORT ")]
    assert p.returncode == 0 and line, p.stderr[-3000:]
    report = json.loads(line[0][len("REPORT ") :])
    report["loopback_accepted_by_host"] = connected
    return report


def _assert_contained(rep: dict) -> None:
    out = rep["attacks"]
    allowed = {k: v for k, v in out.items() if v.startswith("ALLOWED") and not k.endswith("_private")}
    assert not allowed, allowed
    assert rep["host_files_left"] == [] and rep["rc_intact"] and rep["code_intact"]
    assert not rep["weak_isolation"]
    assert rep["fork_bomb"]["limit_hit"] in ("processes", "wall", "cpu", None)
    assert int(rep["processes_started"]) < 16  # max_processes binds for the unprivileged caller


def test_unprivileged_caller_is_isolated():
    rep = run_unprivileged(delegate_cgroup=False)
    assert rep["uid"] == 65534
    assert rep["caps"]["mode"] in ("bwrap", "unshare"), rep["caps"]
    for mode in ("bwrap", "unshare"):
        if rep["caps"][mode]:
            _assert_contained(rep[mode])
            # no cgroup can be created by this user: the result says memory is bounded per process only
            assert rep[mode]["per_process_limits"] == ["memory"]
            assert rep[mode]["memory_4x200mb"]["stdout"] == "done"  # 4 x 200 MB < 4 x 256 MB RLIMIT_AS
    # weak mode runs only when allowed, and then says so in every result
    assert rep["weak_without_consent"] == "ValidationError"
    assert rep["weak"]["weak_isolation"] and "memory" in rep["weak"]["per_process_limits"]
    assert not rep["loopback_accepted_by_host"] or rep["weak"]["attacks"]["loopback"].startswith("blocked")


@pytest.mark.slow
def test_unprivileged_caller_with_delegated_cgroup():
    rep = run_unprivileged(delegate_cgroup=True)
    assert rep["caps"]["cgroup"] == "v1"
    for mode in ("bwrap", "unshare"):
        if rep["caps"][mode]:
            r = rep[mode]
            _assert_contained(r)
            assert r["per_process_limits"] == []
            assert r["fork_bomb"]["limit_hit"] == "processes"
            # 4 x 200 MB in one call of 256 MB: the cgroup's OOM killer stops it, and says so
            assert r["memory_4x200mb"]["limit_hit"] == "memory", r
            assert r["memory_4x200mb"]["peak_memory_mb"] <= 256.5


@pytest.mark.slow
@pytest.mark.skipif(
    not CAPS.cgroup, reason="without a cgroup 32 x 1 GB would reach the host (per-process limits)"
)
def test_32_processes_of_1gb_stay_within_the_call():
    code = textwrap.dedent(
        """
        import os
        kids = []
        for i in range(32):
            pid = os.fork()
            if pid == 0:
                x = bytearray(2**30)
                for j in range(0, len(x), 4096):
                    x[j] = 1
                os._exit(0)
            kids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]
        print(sum(c == -9 for c in codes), sum(c == 0 for c in codes))
        raise SystemExit(1 if any(codes) else 0)
        """
    )
    limits = SandboxLimits(memory_mb=1024, max_processes=64, wall_s=60, cpu_s=30)
    host_pid_score = int(_read(f"/proc/{os.getpid()}/oom_score_adj"))
    r = run_python(code, limits)
    assert r.limit_hit == "memory" and r.peak_memory_mb <= 1024.5, r
    killed, _ = map(int, r.stdout.split())
    assert killed >= 1 and host_pid_score < 1000


# ------------------------------------------------------------------------------------------------
# Issue 30: a call's CPU share, and kernel keys that outlive a call.

# Four processes busy for 3 s of wall time; prints the CPU time they got over that wall window.
CPU_BURN = r"""
import json, os, resource, time
t0 = time.monotonic()
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() - t0 < 3.0:
            pass
        os._exit(0)
    kids.append(pid)
for p in kids:
    os.waitpid(p, 0)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": time.monotonic() - t0}))
"""
CPU_LIMITS = dict(cpus=0.1, wall_s=30, cpu_s=20)


def _cpu_share(r) -> float:
    assert r.exit_code == 0, r
    used = json.loads(r.stdout)
    return used["cpu_s"] / used["wall_s"]


def _assert_cpu_bounded(share: float, throttled_s: float | None) -> None:
    # 0.1 core: four busy processes get at most 0.25 core-seconds per second (2.5x slack for the
    # scheduler's accounting); the kernel reports holding them back. A loaded host only lowers the share.
    assert share <= 0.25, share
    assert throttled_s is not None and throttled_s > 0, throttled_s


@pytest.mark.skipif(not CAPS.cpu_share, reason="no cgroup cpu controller here: the CPU share is not applied")
@pytest.mark.parametrize("mode", MODES)
def test_cpu_share_bounds_the_whole_call(mode):
    r = run_python(CPU_BURN, SandboxLimits(**CPU_LIMITS, isolation=mode))
    _assert_cpu_bounded(_cpu_share(r), r.cpu_throttled_s)
    # cpus=None: no share applied, and the result says so
    r = run_python("print(1)", SandboxLimits(cpus=None, isolation=mode))
    assert r.ok and r.cpu_throttled_s is None


_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}  # add_key, keyctl

# Adds keys to the session, user and user-session keyrings of its uid, and searches its session
# keyring for the caller's key (possession of the caller's session keyring would find it).
KEYS = r"""
import ctypes, json, os
P = json.load(open("params.json"))
add_key, keyctl = P["sys"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
made = 0
for ring in (-3, -4, -5):  # KEY_SPEC_SESSION_KEYRING, _USER_KEYRING, _USER_SESSION_KEYRING
    for i in range(10):
        made += libc.syscall(add_key, b"user", b"flowgrpo-left-%d-%d" % (-ring, i), b"x", 1, ring) > 0
found = libc.syscall(keyctl, 10, -3, b"user", P["secret"].encode(), 0)  # KEYCTL_SEARCH
print(json.dumps({"uid": os.getuid(), "made": made, "secret_found": found > 0}))
"""


def _key_count(uid: int) -> int:
    """Keys the kernel holds for ``uid`` (/proc/key-users; 0 when it has no entry)."""
    with open("/proc/key-users") as f:
        for line in f:
            k, _, rest = line.partition(":")
            if k.strip() == str(uid):
                return int(rest.split()[0])
    return 0


def _settles(uid: int, baseline: int) -> bool:
    """Whether ``uid``'s key count returns to ``baseline`` (the kernel frees keys asynchronously)."""
    return _wait_until(lambda: _key_count(uid) == baseline, timeout=15)


@pytest.mark.skipif(
    os.uname().machine not in _SYSCALLS, reason="add_key/keyctl numbers known for x86_64, aarch64"
)
@pytest.mark.skipif(not CAPS.private_keyrings, reason="no per-call keyrings on this host (see CAPS.missing)")
@pytest.mark.parametrize("mode", [*MODES, "weak"])
def test_keys_a_call_creates_die_with_it(mode):
    import ctypes

    from flowgrpo.sandbox.python import _view

    if os.geteuid() != 0:
        pytest.skip("as root; test_unprivileged_caller_cpu_share_and_keys covers a normal user")
    if mode == "weak" and _view().closed:
        pytest.skip(f"weak mode cannot reach the interpreter under {_view().closed} as the sandbox uid")
    add_key, keyctl = _SYSCALLS[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    secret = f"flowgrpo-secret-{uuid.uuid4().hex[:8]}"
    sid = libc.syscall(add_key, b"user", secret.encode(), b"token", 5, -3)  # our own session keyring
    assert sid > 0, ctypes.get_errno()
    try:
        limits = SMALL.model_copy(update={"isolation": mode, "allow_weak_isolation": mode == "weak"})
        params = {"sys": [add_key, keyctl], "secret": secret}
        r = run_python(KEYS, limits, files={"params.json": json.dumps(params)})
    finally:
        libc.syscall(keyctl, 21, sid)  # KEYCTL_INVALIDATE
    assert r.exit_code == 0, r
    out = json.loads(r.stdout)
    assert out["made"] == 30 and not out["secret_found"], out  # the keys were made, in its own keyrings
    assert out["uid"] != 0 and _settles(out["uid"], 0), _key_count(out["uid"])


# Runs as uid 65534 (run_unprivileged): the same CPU burn and keys in each namespace mode.
AS_USER_CPU_KEYS = r"""
import ctypes, json, os, time, uuid
from flowgrpo.sandbox.python import SandboxLimits, run_python, sandbox_capabilities
caps = sandbox_capabilities()
uid = os.getuid()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
secret = "flowgrpo-secret-" + uuid.uuid4().hex[:8]
def count():
    for line in open("/proc/key-users"):
        k, _, rest = line.partition(":")
        if k.strip() == str(uid):
            return int(rest.split()[0])
    return 0
sid = libc.syscall(SYS[0], b"user", secret.encode(), b"token", 5, -3)
baseline = count()
report = {"uid": uid, "caps": caps.model_dump(), "secret_added": sid > 0}
for mode in [m for m in ("bwrap", "unshare") if getattr(caps, m)]:
    limits = dict(isolation=mode, wall_s=30, cpu_s=20)
    r = run_python(CPU_BURN, SandboxLimits(**limits, cpus=0.1))
    used = json.loads(r.stdout) if r.exit_code == 0 else {"cpu_s": -1, "wall_s": 1}
    k = run_python(KEYS, SandboxLimits(**limits), files={"params.json": json.dumps({"sys": SYS, "secret": secret})})
    t0 = time.monotonic()
    while count() != baseline and time.monotonic() - t0 < 15:
        time.sleep(0.05)
    report[mode] = {"cpu_share": used["cpu_s"] / used["wall_s"], "cpu_throttled_s": r.cpu_throttled_s,
                    "keys": json.loads(k.stdout) if k.exit_code == 0 else k.model_dump(),
                    "keys_left": count() - baseline}
libc.syscall(SYS[1], 21, sid)
print("REPORT " + json.dumps(report))
"""


def _unprivileged_cpu_and_keys(delegate_cgroup: bool) -> dict:
    if os.uname().machine not in _SYSCALLS:
        pytest.skip("add_key/keyctl numbers known for x86_64, aarch64")
    script = (
        f"CPU_BURN = {CPU_BURN!r}\nKEYS = {KEYS!r}\nSYS = {list(_SYSCALLS[os.uname().machine])!r}\n"
        + AS_USER_CPU_KEYS
    )
    rep = run_unprivileged(delegate_cgroup=delegate_cgroup, script=script)
    assert rep["uid"] == 65534 and rep["secret_added"]
    modes = [m for m in ("bwrap", "unshare") if rep["caps"][m]]
    assert modes, rep["caps"]
    for mode in modes:
        keys = rep[mode]["keys"]
        assert keys["made"] == 30 and not keys["secret_found"], keys
        assert rep[mode]["keys_left"] == 0, rep[mode]
    return rep


def test_unprivileged_caller_cpu_share_and_keys():
    rep = _unprivileged_cpu_and_keys(delegate_cgroup=False)
    # no cgroup this user may use: no CPU share, and the capabilities say so
    assert not rep["caps"]["cpu_share"]
    assert any("per-call CPU share" in m for m in rep["caps"]["missing"])
    for mode in ("bwrap", "unshare"):
        if rep["caps"][mode]:
            assert rep[mode]["cpu_throttled_s"] is None


@pytest.mark.slow
def test_unprivileged_caller_cpu_share_with_delegated_cgroup():
    rep = _unprivileged_cpu_and_keys(delegate_cgroup=True)
    if not rep["caps"]["cpu_share"]:
        pytest.skip("this host has no cgroup v1 cpu hierarchy to delegate")
    for mode in ("bwrap", "unshare"):
        if rep["caps"][mode]:
            _assert_cpu_bounded(rep[mode]["cpu_share"], rep[mode]["cpu_throttled_s"])
