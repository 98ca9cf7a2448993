"""The Python sandbox: run model-written code in a separate, limited process.

Used by the ``python`` tool (``flowgrpo.tools.code``) and by the code-test reward
(``flowgrpo.rewards.code``); it lives in the core so that rewards need no plugin.

Layers (each one stops a different failure; see docs/tools.md for the threat list):

1. **Namespaces** (``unshare --net --mount --pid --ipc --uts --fork --mount-proc``, util-linux, when
   the host allows it): no network (a fresh network namespace has only a downed loopback), a private
   pid namespace (the code cannot see or signal host processes; when its init exits the kernel kills
   every process left, so nothing outlives the call), a private mount table in which every mount is
   remounted read-only, nosuid, and the work directory is a size-limited tmpfs.
2. **An unprivileged uid** (a random uid >= 100000, when we run as root): RLIMIT_NPROC binds
   (it does not for uid 0), host files are not writable, ``/proc/<pid>/environ`` of root processes
   is unreadable; ``PR_SET_NO_NEW_PRIVS`` stops setuid binaries from regaining root.
3. **rlimits**: CPU seconds, address space, processes, file size, open files, no core dumps.
4. **The parent**: a wall-clock limit, an output cap (the process is killed once the output passes
   ``max_output_bytes``), ``SIGKILL`` to the whole process group, and cleanup of the work directory.
5. **A scrubbed environment**: only PATH, HOME, TMPDIR, LANG and thread-count variables.

Without namespaces (no ``unshare``, or a container that forbids them) the fallback keeps layers 2-5,
blocks sockets with a Python audit hook (bypassable by native code: not a security boundary) and
kills leftover processes of the sandbox uid; :func:`sandbox_capabilities` says what is missing and a
warning is logged once.

Latency: one call costs about two Python start-ups plus ``unshare`` (see benchmarks/tools.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.aio import run_sync
from flowgrpo.tool import ToolError

log = logging.getLogger(__name__)

LimitName = Literal["wall", "cpu", "memory", "processes", "file_size", "disk", "output"]
UNSHARE_FLAGS = [
    "--net",
    "--mount",
    "--pid",
    "--ipc",
    "--uts",
    "--fork",
    "--mount-proc",
    "--kill-child=SIGKILL",
]


class SandboxLimits(BaseModel):
    """Resource limits of one run. Defaults suit short model-written snippets."""

    model_config = ConfigDict(extra="forbid")
    wall_s: float = Field(10.0, gt=0, description="wall-clock limit; the process group is killed")
    cpu_s: int = Field(5, ge=1, description="RLIMIT_CPU per process")
    memory_mb: int = Field(1024, ge=64, description="RLIMIT_AS (address space) per process")
    max_processes: int = Field(32, ge=1, description="RLIMIT_NPROC for the sandbox uid (threads count)")
    file_size_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE: largest file the code may write")
    disk_mb: int = Field(64, ge=1, description="size of the work-directory tmpfs (namespaces only)")
    max_output_bytes: int = Field(1_000_000, ge=1_000, description="stdout+stderr beyond this kills the run")
    output_chars: int = Field(4_000, ge=100, description="characters of each stream kept in the result")


class SandboxResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed by a signal or by the parent
    signal: int | None = None
    limit_hit: LimitName | None = None
    duration_s: float
    truncated: bool = False
    mode: Literal["namespaces", "rlimits"]

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit_hit is None


class SandboxCapabilities(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["namespaces", "rlimits"]
    namespaces: bool
    user_namespace: bool  # namespaces via --map-root-user (not running as root)
    drop_uid: bool
    missing: list[str]


@functools.lru_cache(maxsize=1)
def sandbox_capabilities() -> SandboxCapabilities:
    """Probe once what this host allows, and say which protections are missing."""
    is_root = os.geteuid() == 0
    unshare = shutil.which("unshare")
    ns = userns = False
    if unshare and sys.platform.startswith("linux"):
        flags = UNSHARE_FLAGS if is_root else ["--user", "--map-root-user", *UNSHARE_FLAGS]
        try:
            ok = subprocess.run([unshare, *flags, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        ns, userns = ok, ok and not is_root
    missing = []
    if not ns:
        missing += [
            "network namespace (sockets are blocked by a Python audit hook only; native code can bypass it)",
            "pid namespace (leftover processes are killed by uid/process group after the call)",
            "read-only filesystem view (world-writable host dirs such as /tmp stay writable)",
            "work-directory size limit (only the per-file limit applies)",
        ]
    if not is_root:
        missing.append(
            "uid drop (code runs as your user: it can read and write your files; RLIMIT_NPROC counts all your processes)"
        )
    caps = SandboxCapabilities(
        mode="namespaces" if ns else "rlimits",
        namespaces=ns,
        user_namespace=userns,
        drop_uid=is_root,
        missing=missing,
    )
    if missing:
        log.warning("python sandbox is missing protections: %s", "; ".join(missing))
    return caps


# The program run inside the sandbox (pid 1 of the new pid namespace, or a plain child in the fallback).
# It prepares the work dir and mounts as root, forks the user process, which drops privileges, applies
# rlimits and execs Python on main.py; it then reports the child's status on a pipe and exits (in a pid
# namespace its exit kills every remaining process).
_BOOT = r"""
import ctypes, json, os, resource, shutil, sys
cfg = json.loads(sys.argv[1])
sfd = cfg["status_fd"]
os.set_inheritable(sfd, False)
def report(s):
    os.write(sfd, (s + "\n").encode())
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
def mount(src, target, fstype, flags, data):
    enc = lambda s: s.encode() if isinstance(s, str) else s
    if libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()) + ": " + str(target))
work, src, uid, ns = cfg["work"], cfg["src"], cfg["uid"], cfg["ns"]
try:
    if ns:
        mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=0700" % cfg["disk_mb"])
        # The interpreter may live under a directory other users cannot enter (e.g. /root/.pyenv):
        # hide that directory behind a tmpfs and bind just the interpreter's prefixes back into it.
        fds, hidden = {}, []
        for p in cfg["needed"]:
            parts = p.split("/")
            for i in range(2, len(parts)):
                anc = "/".join(parts[:i])
                if not os.stat(anc).st_mode & 0o001:
                    fds[p] = os.open(p, os.O_PATH)
                    if anc not in hidden:
                        hidden.append(anc)
                    break
        for anc in hidden:
            mount("tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for p, fd in fds.items():
            os.makedirs(p, exist_ok=True)
            mount("/proc/self/fd/%d" % fd, p, None, MS_BIND | 16384, None)  # MS_REC
    for name in os.listdir(src):
        shutil.copy(os.path.join(src, name), os.path.join(work, name))
    if uid is not None:
        for p in [work] + [os.path.join(work, n) for n in os.listdir(work)]:
            os.chown(p, uid, uid)
    if ns:
        failed = []
        points = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].encode().decode("unicode_escape")
                if mp != work and mp != "/proc" and not mp.startswith("/proc/"):
                    points.append(mp)
        for mp in points:
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if mp == "/dev" or mp.startswith("/dev/") else MS_NODEV)
            try:
                mount(None, mp, None, flags, None)
            except OSError as e:
                failed.append(mp)
        if "/" in failed:
            raise OSError("could not remount / read-only")
except Exception as e:
    report("setup-error %s: %s" % (type(e).__name__, e))
    sys.exit(125)
pid = os.fork()
if pid == 0:
    try:
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        L = cfg["limits"]
        for res, val in ((resource.RLIMIT_CPU, (L["cpu"], L["cpu"] + 1)), (resource.RLIMIT_AS, (L["as"], L["as"])),
                         (resource.RLIMIT_FSIZE, (L["fsize"], L["fsize"])), (resource.RLIMIT_NOFILE, (256, 256)),
                         (resource.RLIMIT_CORE, (0, 0))):
            resource.setrlimit(res, val)
        if L["nproc"] is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (L["nproc"], L["nproc"]))
        os.chdir(work)
        argv = [sys.executable, "-I", "-u", "-X", "utf8"]
        argv += ["-c", cfg["runner"]] if cfg["runner"] else ["main.py"]
        os.execve(sys.executable, argv, cfg["env"])
    except BaseException as e:
        os.write(2, ("sandbox: could not start: %s: %s\n" % (type(e).__name__, e)).encode())
        os._exit(126)
_, status = os.waitpid(pid, 0)
if os.WIFSIGNALED(status):
    report("signal %d" % os.WTERMSIG(status))
else:
    report("exit %d" % os.WEXITSTATUS(status))
"""

# Fallback only: an audit hook (cannot be removed once added) that refuses internet sockets and
# loading native libraries through ctypes, then runs main.py as __main__.
_FALLBACK_RUNNER = textwrap.dedent(
    """
    import sys
    def _hook(event, args):
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg") and args and getattr(
            args[0], "family", 1) != 1:
            raise PermissionError("network access is disabled in this sandbox")
        if event == "socket.getaddrinfo" or event == "ctypes.dlopen" and args and args[0] not in (None,):
            raise PermissionError("network access is disabled in this sandbox")
    sys.addaudithook(_hook)
    sys.argv = ["main.py"]
    sys.path.insert(0, "")
    import runpy
    runpy.run_path("main.py", run_name="__main__")
    """
)


def _sandbox_env(work: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": work,
        "TMPDIR": work,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


def _truncate(data: bytes, limit: int) -> tuple[str, bool]:
    text = data.decode("utf-8", errors="replace")
    if len(text) <= limit:
        return text, False
    head = text[: limit * 2 // 3]
    tail = text[-(limit // 3) :]
    return f"{head}\n... [{len(text) - len(head) - len(tail)} characters cut] ...\n{tail}", True


def _kill_uid(uid: int) -> None:
    """Fallback cleanup: SIGKILL every process of the sandbox uid (it is used by no one else)."""
    for _ in range(3):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), signal.SIGKILL)
                    found = True
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return
        time.sleep(0.01)


def _classify(stderr: bytes, sig: int | None) -> LimitName | None:
    if sig == signal.SIGXCPU:
        return "cpu"
    if sig == signal.SIGXFSZ:
        return "file_size"
    tail = stderr[-2000:]
    if b"MemoryError" in tail or b"Cannot allocate memory" in tail:
        return "memory"
    if b"BlockingIOError" in tail or b"Resource temporarily unavailable" in tail:
        return "processes"
    if b"File too large" in tail:
        return "file_size"
    if b"No space left on device" in tail:
        return "disk"
    return None


async def arun_python(
    code: str, limits: SandboxLimits | None = None, *, files: Mapping[str, str | bytes] | None = None
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh sandbox; ``files`` are written next to it first."""
    limits = limits or SandboxLimits()
    caps = sandbox_capabilities()
    ns = caps.namespaces
    is_root = os.geteuid() == 0
    uid = random.randrange(100_000, 1_000_000) if is_root and not caps.user_namespace else None
    base = tempfile.mkdtemp(prefix="flowgrpo-sandbox-")
    os.chmod(base, 0o711)  # the sandbox uid may traverse it to reach work/, not list it
    src, work = os.path.join(base, "src"), os.path.join(base, "work")
    os.mkdir(src, 0o700)
    os.mkdir(work, 0o700)
    with open(os.path.join(src, "main.py"), "w", encoding="utf-8") as f:
        f.write(code)
    for name, content in (files or {}).items():
        if "/" in name or name in ("", ".", "..", "main.py"):
            raise ValueError(f"file name {name!r} must be a plain name other than main.py")
        with open(os.path.join(src, name), "wb") as fb:
            fb.write(content.encode() if isinstance(content, str) else content)
    nproc: int | None = limits.max_processes
    if uid is None and not ns:  # same uid as us: the limit counts all our processes
        nproc = (
            None
            if is_root
            else limits.max_processes + sum(1 for e in os.listdir("/proc") if e.isdigit() and _owned(e))
        )
    if caps.user_namespace:
        nproc = None  # would count every process of the real user; the pid namespace bounds lifetime instead
    rfd, wfd = os.pipe()
    cfg = {
        "status_fd": wfd,
        "work": work,
        "src": src,
        "uid": uid,
        "ns": ns,
        "disk_mb": limits.disk_mb,
        "needed": sorted(
            {
                os.path.realpath(p)
                for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)))
            }
        ),
        "env": _sandbox_env(work),
        "runner": None if ns else _FALLBACK_RUNNER,
        "limits": {
            "cpu": limits.cpu_s,
            "as": limits.memory_mb * 2**20,
            "fsize": limits.file_size_mb * 2**20,
            "nproc": nproc,
        },
    }
    boot = [sys.executable, "-I", "-S", "-c", _BOOT, json.dumps(cfg)]
    if ns:
        flags = UNSHARE_FLAGS if not caps.user_namespace else ["--user", "--map-root-user", *UNSHARE_FLAGS]
        boot = [shutil.which("unshare") or "unshare", *flags, *boot]
    t0 = time.perf_counter()
    limit_hit: LimitName | None = None
    out = {"stdout": bytearray(), "stderr": bytearray()}
    try:
        proc = await asyncio.create_subprocess_exec(
            *boot,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(wfd,),
            start_new_session=True,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            cwd=base,
        )
        os.close(wfd)
        wfd = -1
        over = asyncio.Event()

        async def pump(stream: asyncio.StreamReader, key: str) -> None:
            # Read to EOF even past the cap (discarding): on Python 3.11 Process.wait() resolves only
            # once every pipe is closed, and a reader that stops would pause the transport forever.
            while chunk := await stream.read(65536):
                room = limits.max_output_bytes - len(out["stdout"]) - len(out["stderr"])
                out[key] += chunk[: max(room, 0)]
                if room < len(chunk):
                    over.set()

        pumps = [
            asyncio.create_task(pump(proc.stdout, "stdout")),
            asyncio.create_task(pump(proc.stderr, "stderr")),
        ]  # type: ignore[arg-type]
        waiter = asyncio.create_task(proc.wait())
        over_task = asyncio.create_task(over.wait())
        done, _ = await asyncio.wait(
            {waiter, over_task}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter not in done:
            limit_hit = "output" if over.is_set() else "wall"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.wait({waiter}, timeout=10)
            waiter.cancel()  # a no-op once it is done
        over_task.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers in our process group
        if uid is not None and not ns:
            await asyncio.to_thread(_kill_uid, uid)
        await asyncio.wait(pumps, timeout=0.5)
        for p in pumps:
            p.cancel()
        duration = time.perf_counter() - t0
        os.set_blocking(rfd, False)
        try:
            status = os.read(rfd, 4096).decode(errors="replace").strip()
        except BlockingIOError:
            status = ""
    finally:
        os.close(rfd)
        if wfd >= 0:
            os.close(wfd)
        shutil.rmtree(base, ignore_errors=True)
    exit_code: int | None = None
    sig: int | None = None
    if status.startswith("setup-error"):
        raise ToolError(f"the sandbox could not start: {status[len('setup-error ') :]}")
    if status.startswith("exit "):
        exit_code = int(status.split()[1])
    elif status.startswith("signal "):
        sig = int(status.split()[1])
    if limit_hit is None and (exit_code != 0 or sig is not None):
        limit_hit = _classify(bytes(out["stderr"]), sig)
    stdout, t1 = _truncate(bytes(out["stdout"]), limits.output_chars)
    stderr, t2 = _truncate(bytes(out["stderr"]), limits.output_chars)
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        signal=sig,
        limit_hit=limit_hit,
        duration_s=duration,
        truncated=t1 or t2 or limit_hit == "output",
        mode="namespaces" if ns else "rlimits",
    )


def _owned(pid: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def run_python(
    code: str, limits: SandboxLimits | None = None, *, files: Mapping[str, str | bytes] | None = None
) -> SandboxResult:
    """Synchronous :func:`arun_python` (usable from inside a running event loop too)."""
    return run_sync(arun_python(code, limits, files=files))


__all__ = [
    "SandboxCapabilities",
    "SandboxLimits",
    "SandboxResult",
    "arun_python",
    "run_python",
    "sandbox_capabilities",
]
