"""The Python sandbox: run model-written code in a separate, limited process.

Used by the ``python`` tool (``flowgrpo.tools.code``) and by the code-test reward
(``flowgrpo.rewards.code``); it lives in the core so that rewards need no plugin.

Isolation, best first (``SandboxLimits.isolation="auto"`` picks the first that works on this host):

1. **bwrap** (bubblewrap, the tool made for this): an empty read-only root with only the system
   directories (``SYSTEM_DIRS``), the base interpreter (its site-packages covered) and ``ETC_FILES``
   bound read-only, private ``/tmp``, ``/dev/shm``, ``/dev``, ``/proc``: no project tree, task data,
   home directories, ``/run`` or other users' files; new network, pid, ipc and uts namespaces; capabilities dropped; ``--die-with-parent`` and ``--new-session``. As a normal user it
   also makes a user namespace (mounts made there cannot be undone by the code: it has no capabilities,
   and nested user namespaces are disabled).
2. **unshare** (util-linux): the boot program below covers every other top-level directory with an
   empty read-only tmpfs (top-level files with ``/dev/null``) and binds the interpreter back, in new
   mount, network, pid, ipc and uts namespaces. As a normal user the code runs in a second, nested user namespace as a
   non-root uid, so it holds no capability over the mounts of the first (the kernel also locks mounts
   copied into a less privileged namespace: mount_namespaces(7), "Restrictions on mount namespaces").
3. **weak** (neither works): rlimits, a scrubbed environment and a Python audit hook only. Refused
   unless ``allow_weak_isolation=True``; every result then says ``weak_isolation=True``.

In every mode: a random unprivileged uid when we run as root; ``PR_SET_NO_NEW_PRIVS``; rlimits (CPU,
file size, open files, processes, and address space when no cgroup bounds memory); the parent's wall
clock and output cap; a per-call cgroup (:mod:`flowgrpo.sandbox.cgroup`) bounding memory, processes and the CPU
share (``SandboxLimits.cpus``, one core by default) of the whole call when one can be created; the
call's own session keyring, and as root its own user namespace, so that kernel keys the code creates
(``add_key``: kept by the kernel, not by any process) are freed with the call and never reach the
trainer's keyrings or the next call; ``oom_score_adj=1000`` so that the host's OOM killer picks sandbox
processes before the trainer; ``PR_SET_PDEATHSIG`` so that nothing outlives a killed trainer; a
SIGKILL of the process group and the cgroup on every exit path, cancellation included.

The code's files travel in a memfd, so the namespace modes leave nothing on the host filesystem;
only the weak mode needs a ``flowgrpo-sandbox-<pid>-*`` directory, and directories or cgroups left by a
trainer killed with SIGKILL are removed by the next process that starts a sandbox.

A limit is reported (``SandboxResult.limit_hit``) only from what the kernel or the parent observed:
the exit signal, the CPU time in the child's rusage, the cgroup's ``oom_kill`` and ``pids.events``
counters, the work filesystem's free space, a file at exactly the size limit, the parent's clock and
output count. Text the code printed (``MemoryError``) never decides it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowgrpo.sandbox import cgroup
from flowgrpo.tool import ToolError
from flowgrpo.utils.aio import run_sync

log = logging.getLogger(__name__)

LimitName = Literal["wall", "cpu", "memory", "processes", "file_size", "disk", "output"]
Isolation = Literal["bwrap", "unshare", "weak"]
WORK = "/tmp/sandbox"  # the code's work directory inside the namespace modes (a private tmpfs)
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
# Processes of the call besides the code's: bwrap, its pid-1 reaper and the boot program; unshare and
# the boot program; the boot program. They live in the call's cgroup too.
EXTRA_PIDS = {"bwrap": 3, "unshare": 2, "weak": 1}


class SandboxUnavailableError(ToolError):
    """No isolation this host supports meets the request (and weak isolation was not allowed)."""


class SandboxLimits(BaseModel):
    """Resource limits of one run, and the isolation it requires. Defaults suit short snippets."""

    model_config = ConfigDict(extra="forbid")
    wall_s: float = Field(10.0, gt=0, description="wall-clock limit; the process group is killed")
    cpu_s: int = Field(5, ge=1, description="RLIMIT_CPU per process")
    memory_mb: int = Field(
        1024, ge=64, description="memory of the whole call (cgroup); RLIMIT_AS per process when no cgroup"
    )
    max_processes: int = Field(32, ge=1, description="processes and threads of the call")
    cpus: float | None = Field(
        1.0,
        gt=0,
        description="CPU share of the whole call in cores (cgroup cpu.max / cpu.cfs_quota_us: 0.5 = half "
        "a core, 2 = two cores' time over any number of cores); null = unbounded. Without a cgroup cpu "
        "controller only wall_s and cpu_s (per process) bound it, and sandbox_capabilities() says so",
    )
    file_size_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE: largest file the code may write")
    disk_mb: int = Field(64, ge=1, description="size of the private /tmp and /dev/shm (namespace modes)")
    max_output_bytes: int = Field(1_000_000, ge=1_000, description="stdout+stderr beyond this kills the run")
    output_chars: int = Field(4_000, ge=100, description="characters of each stream kept in the result")
    isolation: Literal["auto", "bwrap", "unshare", "weak"] = Field(
        "auto", description="auto = bwrap if it works here, else unshare, else weak (if allowed)"
    )
    allow_weak_isolation: bool = Field(
        False,
        description="run with rlimits only when no namespace isolation works (the code can then read "
        "and write what your user can, and reach the network); every result says so",
    )

    @model_validator(mode="after")
    def _weak_needs_consent(self) -> SandboxLimits:
        if self.isolation == "weak" and not self.allow_weak_isolation:
            raise ValueError(
                "isolation='weak' leaves your files and the network reachable from the code; "
                "set allow_weak_isolation=True to accept that"
            )
        return self


class SandboxResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed by a signal or by the parent
    signal: int | None = None
    limit_hit: LimitName | None = None
    duration_s: float
    truncated: bool = False
    mode: Isolation
    weak_isolation: bool = False
    per_process_limits: list[Literal["memory", "processes"]] = Field(
        default_factory=list, description="limits that bound each process, not the whole call"
    )
    peak_memory_mb: float | None = None  # the call's cgroup peak, when there is one
    cpu_throttled_s: float | None = Field(
        None,
        description="seconds the kernel held the call back to keep it within limits.cpus; None: no CPU "
        "share was applied (cpus=null, or no cgroup cpu controller here)",
    )

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit_hit is None


class SandboxCapabilities(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Isolation  # the best mode that works here
    bwrap: str | None  # path of a working bwrap
    unshare: str | None  # path of a working unshare
    cgroup: Literal["v1", "v2"] | None  # per-call memory and process limits
    cpu_share: bool  # a per-call CPU share (SandboxLimits.cpus) can be applied
    private_keyrings: bool  # keys the code creates are freed with the call (own session keyring, user ns)
    drop_uid: bool
    missing: list[str]  # protections the best mode lacks

    @property
    def namespaces(self) -> bool:
        return self.mode != "weak"


# Top-level system directories the sandbox sees read-only (programs and shared libraries), and the
# files of /etc the dynamic loader and time functions read. Nothing else of the host is visible.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime")


@dataclass(frozen=True)
class _View:
    """The filesystem the namespace modes show: the interpreter, its standard library, system
    libraries, a private /tmp (the work directory), /dev and /proc; nothing else of the host."""

    python: str  # the base interpreter (outside any virtual environment)
    system: tuple[str, ...]  # SYSTEM_DIRS present here, read-only (symlinks stay symlinks)
    bind: tuple[str, ...]  # the interpreter's installation and ETC_FILES, bound read-only
    cover: tuple[str, ...]  # site-packages of the interpreter: covered by an empty read-only tmpfs
    hide: tuple[str, ...]  # unshare mode: top-level directories covered by an empty read-only tmpfs
    mask: tuple[str, ...]  # unshare mode: top-level files covered by /dev/null
    closed: tuple[str, ...]  # directories above the interpreter that other users cannot enter


def _under(p: str, d: str) -> bool:
    return p == d or p.startswith(d.rstrip("/") + "/")


def _minimal(paths: list[str]) -> list[str]:
    """Drop paths inside another path of the list."""
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


def base_python() -> str:
    """The interpreter the sandbox runs: the base installation's, never a virtual environment's (whose
    site-packages, usually inside the project, the code must not see)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.lru_cache(maxsize=1)
def _view() -> _View:
    python = base_python()
    system = tuple(d for d in SYSTEM_DIRS if os.path.lexists(d))
    install = [os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)]
    install.append(os.path.dirname(python))
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and os.path.isdir(
        sysconfig.get_config_var("LIBDIR") or ""
    ):
        install.append(os.path.realpath(sysconfig.get_config_var("LIBDIR")))
    install = [p for p in _minimal(install) if p != "/" and not any(_under(p, s) for s in system)]
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    base_paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    cover = [
        os.path.realpath(p)
        for p in (
            os.path.join(stdlib, "site-packages"),
            os.path.join(stdlib, "dist-packages"),
            base_paths["purelib"],
            base_paths["platlib"],
        )
        if os.path.isdir(p)
    ]
    visible = [*system, *install]
    cover = [c for c in _minimal(cover) if any(_under(c, v) and c != v for v in visible)]
    hide, mask = [], []
    for name in sorted(os.listdir("/")):
        p = "/" + name
        if p in system or p in ("/dev", "/proc", "/tmp") or os.path.islink(p):
            continue
        (hide if os.path.isdir(p) else mask).append(p)
    closed = []
    for p in install:  # a directory the sandbox uid cannot enter (e.g. /root/.pyenv under 0700 /root)
        parts = p.split("/")
        for i in range(2, len(parts)):
            anc = "/".join(parts[:i])
            if not os.stat(anc).st_mode & stat.S_IXOTH:
                closed.append(anc)
                break
    bind = [*install, *(f for f in ETC_FILES if os.path.exists(f))]
    return _View(
        python=python,
        system=system,
        bind=tuple(bind),
        cover=tuple(cover),
        hide=tuple(hide),
        mask=tuple(mask),
        closed=tuple(_minimal(closed)),
    )


def _kernel_at_least(major: int, minor: int) -> bool:
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (major, minor)


def _bwrap_argv(bwrap: str, disk_mb: int) -> list[str]:
    """bwrap builds the view on an empty root: system directories, the interpreter, a few /etc files."""
    is_root = os.geteuid() == 0
    view = _view()
    size = str(disk_mb * 2**20)
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-net"]
    argv += ["--unshare-uts", "--unshare-cgroup-try"]
    if is_root:  # the boot program drops to a random uid (all capabilities go with it) after chown
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_CHOWN"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    for s in view.system:
        argv += ["--symlink", os.readlink(s), s] if os.path.islink(s) else ["--ro-bind", s, s]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    argv += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    argv += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
    made: set[str] = {"/", "/tmp", "/dev", "/proc", *view.system}
    for b in view.bind:
        parts = b.strip("/").split("/")
        for i in range(1, len(parts)):  # bwrap would copy the host's modes (0700) onto these
            anc = "/" + "/".join(parts[:i])
            if anc not in made and not any(_under(anc, s) for s in view.system):
                argv += ["--perms", "0755", "--dir", anc]
                made.add(anc)
        argv += ["--ro-bind", b, b]
    for c in view.cover:
        argv += ["--size", "65536", "--tmpfs", c, "--remount-ro", c]
    argv += ["--remount-ro", "/"]
    return [*argv, "--chdir", "/", "--"]


def _unshare_argv(unshare: str) -> list[str]:
    if os.geteuid() == 0:
        return [unshare, *UNSHARE_FLAGS]
    return [unshare, "--user", "--map-root-user", *UNSHARE_FLAGS]


# Runs first, outside every namespace: joins the call's cgroup (so that every later process is in it
# from its first instruction), makes itself the OOM killer's first choice, asks for SIGKILL when the
# trainer dies (kept across exec; bwrap and unshare pass it on), then execs the isolation command.
_LAUNCH = r"""
import ctypes, json, os, sys
cfg = json.loads(sys.argv[1])
try:
    for f in cfg["cgroup_procs"]:
        with open(f, "w") as fh:
            fh.write(str(os.getpid()))
    with open("/proc/self/oom_score_adj", "w") as fh:
        fh.write("1000")
except OSError as e:
    os.write(cfg["status_fd"], (json.dumps({"setup_error": "joining the call's cgroup: %s" % e}) + "\n").encode())
    os._exit(125)
ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL
if os.getppid() != cfg["parent"]:
    os._exit(125)
os.execv(sys.argv[2], sys.argv[2:])
"""

# The program run inside the isolation (pid 1 or 2 of the new pid namespace, or a plain child in the
# weak mode). In the unshare mode it builds the filesystem view; in every mode it writes the code's
# files into the work directory, forks the code's process (which drops privileges, applies rlimits
# and execs Python on main.py), waits for it and reports what the kernel says about its end on a pipe
# the code cannot reach. When it exits, the pid namespace's kernel-side teardown kills what is left.
_BOOT = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
sfd, ffd = cfg["status_fd"], cfg["files_fd"]
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: code of the same uid cannot ptrace us or open our fds
def report(**kw):
    os.write(sfd, (json.dumps(kw) + "\n").encode())
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
def mount(src, target, fstype, flags, data):
    enc = lambda s: s.encode() if isinstance(s, str) else s
    if libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()) + ": " + str(target))
mode, work, uid = cfg["mode"], cfg["work"], cfg["uid"]
try:
    if mode == "unshare":
        fds = {p: os.open(p, os.O_PATH) for p in cfg["bind"]}
        for d in ("/tmp", "/dev/shm"):
            mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=1777" % cfg["disk_mb"])
        for d in cfg["hide"]:
            mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for f in cfg["mask"]:  # best effort: a top-level file, not a directory of the host
            try:
                mount("/dev/null", f, None, MS_BIND, None)
            except OSError:
                pass
        for p, fd in fds.items():
            if os.path.isdir("/proc/self/fd/%d" % fd):
                os.makedirs(p, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
            mount("/proc/self/fd/%d" % fd, p, None, MS_BIND | MS_REC, None)
            os.close(fd)
        for d in cfg["cover"]:
            mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        points = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].encode().decode("unicode_escape")
                if mp not in ("/tmp", "/dev/shm", "/proc") and not mp.startswith("/proc/"):
                    points.append(mp)
        failed = []
        for mp in points:
            dev = mp == "/dev" or mp.startswith("/dev/")
            try:
                mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if dev else MS_NODEV), None)
            except OSError:
                failed.append(mp)
        if "/" in failed:
            raise OSError("could not remount / read-only")
    os.mkdir(work, 0o700)
    data = b""
    while chunk := os.pread(ffd, 1 << 20, len(data)):
        data += chunk
    os.ftruncate(ffd, 0)  # other holders of the memfd (bwrap's init) keep nothing readable
    os.close(ffd)
    for name, content in json.loads(data).items():
        with open(os.path.join(work, name), "wb") as f:
            f.write(__import__("base64").b64decode(content))
    if uid is not None:
        for p in [work] + [os.path.join(work, n) for n in os.listdir(work)]:
            os.chown(p, uid, uid)
except Exception as e:
    report(setup_error="%s: %s" % (type(e).__name__, e))
    sys.exit(125)
pid = os.fork()
if pid == 0:
    try:
        if cfg["nested_userns"]:
            if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER): " + os.strerror(ctypes.get_errno()))
            inner = 1000
            for name, text in (("setgroups", "deny"), ("uid_map", "%d 0 1" % inner), ("gid_map", "%d 0 1" % inner)):
                with open("/proc/self/" + name, "w") as f:
                    f.write(text)
            os.setresgid(inner, inner, inner)
            os.setresuid(inner, inner, inner)  # no capability left in any namespace
        elif uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if cfg["keyring_userns"]:  # the uid's user keyrings live in this namespace and die with it
                if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER): " + os.strerror(ctypes.get_errno()))
                libc.prctl(4, 1, 0, 0, 0)  # dumpable again (the uid change cleared it): /proc/self is ours
                for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)), ("gid_map", "%d %d 1" % (uid, uid))):
                    with open("/proc/self/" + name, "w") as f:
                        f.write(text)
        if cfg["keyctl"] is not None:  # KEYCTL_JOIN_SESSION_KEYRING, NULL: a new anonymous session keyring
            if libc.syscall(cfg["keyctl"], 1, None) < 0:
                raise OSError(ctypes.get_errno(), "keyctl(JOIN_SESSION_KEYRING): " + os.strerror(ctypes.get_errno()))
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL (after the uid change, which clears it)
        L = cfg["limits"]
        for res, val in ((resource.RLIMIT_CPU, (L["cpu"], L["cpu"] + 1)), (resource.RLIMIT_FSIZE, (L["fsize"], L["fsize"])),
                         (resource.RLIMIT_NOFILE, (256, 256)), (resource.RLIMIT_CORE, (0, 0))):
            resource.setrlimit(res, val)
        if L["as"] is not None:
            resource.setrlimit(resource.RLIMIT_AS, (L["as"], L["as"]))
        if L["nproc"] is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (L["nproc"], L["nproc"]))
        os.chdir(work)
        os.closerange(3, 1 << 16)
        argv = [sys.executable, "-I", "-u", "-X", "utf8"]
        argv += ["-c", cfg["runner"]] if cfg["runner"] else ["main.py"]
        os.execve(sys.executable, argv, cfg["env"])
    except BaseException as e:
        os.write(2, ("sandbox: could not start: %s: %s\n" % (type(e).__name__, e)).encode())
        os._exit(126)
_, status, ru = os.wait4(pid, 0)
big_file = False
for root, dirs, names in os.walk(work):
    for n in names:
        try:
            big_file |= os.lstat(os.path.join(root, n)).st_size >= cfg["limits"]["fsize"]
        except OSError:
            pass
st = os.statvfs(work)
report(
    exit=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
    signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
    cpu_s=ru.ru_utime + ru.ru_stime,
    disk_full=mode != "weak" and st.f_bavail * st.f_frsize < max(65536, st.f_blocks * st.f_frsize // 100),
    big_file=big_file,
)
"""

# Weak mode only: an audit hook (cannot be removed once added) that refuses internet sockets and
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


def _probe(argv: list[str]) -> bool:
    try:
        r = subprocess.run(argv, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if r.returncode != 0:
        log.debug("sandbox probe %s failed: %s", argv[0], r.stderr.decode(errors="replace")[-500:])
    return r.returncode == 0


# Proves the interpreter starts inside and, for a normal user, that the nested user namespace of the
# unshare mode can be made.
_PROBE = (
    "import ctypes, os\n"
    "if os.getuid() == 0 and os.environ.get('FLOWGRPO_NESTED') == '1':\n"
    "    assert ctypes.CDLL(None).unshare(0x10000000) == 0\n"
)

# Proves what the code's process does for private keyrings works in a mode: as root, an unprivileged
# uid makes a user namespace (FLOWGRPO_USERNS_UID); then a new session keyring is joined.
_KEYRING_PROBE = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None)\n"
    "uid = int(os.environ.get('FLOWGRPO_USERNS_UID', '0'))\n"
    "if uid:\n"
    "    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)\n"
    "    assert libc.unshare(0x10000000) == 0\n"
    "    libc.prctl(4, 1, 0, 0, 0)\n"
    "    for name, text in (('setgroups', 'deny'), ('uid_map', '%d %d 1' % (uid, uid)), ('gid_map', '%d %d 1' % (uid, uid))):\n"
    "        with open('/proc/self/' + name, 'w') as f:\n"
    "            f.write(text)\n"
    "assert libc.syscall(int(os.environ['FLOWGRPO_KEYCTL']), 1, None) >= 0\n"
)

# keyctl(2)'s syscall number (glibc exports no wrapper; libkeyutils may not be installed).
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 311, "ppc64": 311, "s390x": 280}


def _sys_keyctl() -> int | None:
    return _SYS_KEYCTL.get(os.uname().machine)


def probe_isolation(bwrap: str | None, unshare: str | None) -> SandboxCapabilities:
    """What isolation works here with these binaries (None = not installed); no caching."""
    is_root = os.geteuid() == 0
    linux = sys.platform.startswith("linux")
    py = [_view().python, "-I", "-S", "-c", _PROBE]
    bw = bwrap if bwrap and linux and _probe([*_bwrap_argv(bwrap, 1), *py]) else None
    nested = [] if is_root else ["env", "FLOWGRPO_NESTED=1"]
    un = unshare if unshare and linux and _probe([*_unshare_argv(unshare), *nested, *py]) else None
    mode: Isolation = "bwrap" if bw else "unshare" if un else "weak"
    parents = cgroup.find_parents() if linux else None
    keyctl = _sys_keyctl() if linux else None
    keyrings = keyctl is not None and (
        (not is_root and mode != "weak")  # the mode's user namespace holds the code's user keyrings
        or (is_root and _probe(_keyring_probe_argv(mode, bw, un, keyctl)))
    )
    missing = []
    if mode == "weak":
        missing += [
            "network namespace (sockets are blocked by a Python audit hook only; native code can bypass it)",
            "pid namespace (processes the code starts in a new session may outlive the call)",
            "read-only filesystem view (your files, /tmp and /dev/shm stay writable by the code)",
            "work-directory size limit (only the per-file limit applies)",
        ]
        if not is_root:
            missing.append("uid drop (the code runs as your user: it can read and write your files)")
    if parents is None:
        missing.append(
            "per-call memory limit (no cgroup can be created here: RLIMIT_AS bounds each process, so "
            "max_processes x memory_mb in total)"
        )
    if parents is None or parents.cpu is None:
        where = "no cgroup can be created here" if parents is None else "no cgroup cpu controller here"
        missing.append(
            f"per-call CPU share ({where}: a call may keep every core busy until its wall_s limit; only "
            "cpu_s per process bounds it)"
        )
    if not is_root and (mode == "weak" or not _kernel_at_least(5, 14)):
        missing.append("per-call process limit (RLIMIT_NPROC counts all processes of your user)")
    if not keyrings:
        missing.append(
            "private kernel keyrings (keys the code adds with add_key can outlive the call and reach "
            "your session keyring)"
        )
    return SandboxCapabilities(
        mode=mode,
        bwrap=bw,
        unshare=un,
        cgroup=None if parents is None else ("v1" if parents.version == 1 else "v2"),
        cpu_share=parents is not None and parents.cpu is not None,
        private_keyrings=keyrings,
        drop_uid=is_root,
        missing=missing,
    )


def _keyring_probe_argv(mode: Isolation, bwrap: str | None, unshare: str | None, keyctl: int) -> list[str]:
    """The keyring probe run the way a call of ``mode`` runs its code (root only)."""
    env = ["env", f"FLOWGRPO_KEYCTL={keyctl}", f"FLOWGRPO_USERNS_UID={random.randrange(100_000, 1_000_000)}"]
    py = [_view().python, "-I", "-S", "-c", _KEYRING_PROBE]
    if mode == "bwrap" and bwrap:
        return [*_bwrap_argv(bwrap, 1), *env, *py]
    if mode == "unshare" and unshare:
        return [*_unshare_argv(unshare), *env, *py]
    return [*env, *py]


@functools.lru_cache(maxsize=1)
def sandbox_capabilities() -> SandboxCapabilities:
    """Probe once what this host allows (bwrap and unshare from PATH), and say what is missing."""
    caps = probe_isolation(shutil.which("bwrap"), shutil.which("unshare"))
    if caps.missing:
        log.warning("python sandbox (%s) is missing protections: %s", caps.mode, "; ".join(caps.missing))
    return caps


def choose_isolation(limits: SandboxLimits, caps: SandboxCapabilities) -> Isolation:
    """The mode a run uses, or a :class:`SandboxUnavailableError` that says how to get one."""
    want = limits.isolation
    if want == "weak":
        return "weak"
    if want == "bwrap" and caps.bwrap:
        return "bwrap"
    if want == "unshare" and caps.unshare:
        return "unshare"
    if want == "auto" and caps.mode != "weak":
        return caps.mode
    if want == "auto" and limits.allow_weak_isolation:
        return "weak"
    how = (
        "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) "
        "and allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, "
        "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04+)"
    )
    what = (
        "no namespace isolation works on this host"
        if want == "auto"
        else f"isolation={want!r} does not work here"
    )
    raise SandboxUnavailableError(
        f"the python sandbox cannot isolate code: {what}; {how}; or accept running code with rlimits only "
        "(it can read and write your files and reach the network) with allow_weak_isolation=True"
    )


def require_isolation(limits: SandboxLimits) -> Isolation:
    """Fail early (at construction of a tool or environment) rather than at the first call."""
    return choose_isolation(limits, sandbox_capabilities())


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
    """Weak mode as root: SIGKILL every process of the sandbox uid (it is used by no one else)."""
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


def _owned(pid: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def remove_stale(tmpdir: str | None = None) -> int:
    """Remove ``flowgrpo-sandbox-<pid>-*`` directories and cgroups whose creator is dead.

    A trainer killed with SIGKILL cannot clean up; the next process that runs a sandbox does.
    Returns how many were removed."""
    tmpdir = tmpdir or tempfile.gettempdir()
    removed = 0
    pattern = re.compile(re.escape(cgroup.PREFIX) + r"(\d+)-")
    with contextlib.suppress(OSError):
        for name in os.listdir(tmpdir):
            m = pattern.match(name)
            if m and not cgroup.pid_alive(int(m.group(1))):
                shutil.rmtree(os.path.join(tmpdir, name), ignore_errors=True)
                removed += not os.path.exists(os.path.join(tmpdir, name))
    parents = cgroup.find_parents()
    if parents is not None:
        removed += cgroup.remove_stale(parents)
    return removed


@functools.lru_cache(maxsize=1)
def _startup_cleanup() -> None:
    n = remove_stale()
    if n:
        log.info("removed %d sandbox directories or cgroups left by killed processes", n)


def _classify(report: dict, limits: SandboxLimits, *, oom_kills: int, fork_refusals: int) -> LimitName | None:
    sig = report.get("signal")
    if oom_kills:
        return "memory"
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and report.get("cpu_s", 0) >= limits.cpu_s):
        return "cpu"
    if sig == signal.SIGXFSZ or report.get("big_file"):
        return "file_size"
    if fork_refusals:
        return "processes"
    if report.get("disk_full"):
        return "disk"
    return None


async def arun_python(
    code: str, limits: SandboxLimits | None = None, *, files: Mapping[str, str | bytes] | None = None
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh sandbox; ``files`` are written next to it first."""
    limits = limits or SandboxLimits()
    contents: dict[str, bytes] = {"main.py": code.encode()}
    for name, content in (files or {}).items():
        if "/" in name or "\0" in name or name in ("", ".", "..", "main.py"):
            raise ValueError(f"file name {name!r} must be a plain name other than main.py")
        contents[name] = content.encode() if isinstance(content, str) else content
    caps = sandbox_capabilities()
    mode = choose_isolation(limits, caps)
    _startup_cleanup()
    is_root = os.geteuid() == 0
    uid = random.randrange(100_000, 1_000_000) if is_root else None
    parents = cgroup.find_parents()
    cg: cgroup.CallCgroup | None = None
    if parents is not None:
        try:
            cg = cgroup.CallCgroup(
                parents,
                memory_bytes=limits.memory_mb * 2**20,
                max_pids=limits.max_processes + EXTRA_PIDS[mode],
                cpus=limits.cpus,
            )
        except OSError as e:
            log.warning("no cgroup for this sandbox call (%s): memory is limited per process only", e)
    per_process: list[Literal["memory", "processes"]] = [] if cg else ["memory"]
    # With a cgroup, pids.max is the binding limit (and counts refusals); RLIMIT_NPROC stays as a backstop.
    nproc: int | None = limits.max_processes + (EXTRA_PIDS[mode] + 1 if cg else 0)
    if mode == "weak" and not is_root:  # same uid as us: the limit counts all our processes
        nproc += sum(1 for e in os.listdir("/proc") if e.isdigit() and _owned(e))
        per_process.append("processes")
    elif not is_root and not _kernel_at_least(5, 14):
        nproc = None  # before 5.14 RLIMIT_NPROC counts every process of the real user, in any namespace
        if cg is None:
            per_process.append("processes")
    base = None
    if mode == "weak" and is_root and _view().closed:
        raise SandboxUnavailableError(
            f"weak isolation runs code as a random unprivileged uid, which cannot reach the Python "
            f"interpreter under {', '.join(_view().closed)} (not enterable by other users); use an "
            "interpreter outside it, or install bubblewrap"
        )
    if mode == "weak":
        base = tempfile.mkdtemp(prefix=f"{cgroup.PREFIX}{os.getpid()}-")
        os.chmod(base, 0o711)  # the sandbox uid may traverse it to reach work/, not list it
    work = os.path.join(base, "work") if base else WORK
    view = _view()
    rfd, wfd = os.pipe()
    memfd = os.memfd_create("flowgrpo-sandbox-files")
    with open(memfd, "wb", closefd=False) as f:
        f.write(json.dumps({k: base64.b64encode(v).decode() for k, v in contents.items()}).encode())
    cfg = {
        "status_fd": wfd,
        "files_fd": memfd,
        "mode": mode,
        "work": work,
        "uid": uid,
        "nested_userns": mode == "unshare" and not is_root,
        "keyring_userns": is_root and caps.private_keyrings,
        "keyctl": _sys_keyctl() if caps.private_keyrings else None,
        "disk_mb": limits.disk_mb,
        "hide": list(view.hide),
        "mask": list(view.mask),
        "bind": list(view.bind),
        "cover": list(view.cover),
        "env": _sandbox_env(work),
        "runner": _FALLBACK_RUNNER if mode == "weak" else None,
        "limits": {
            "cpu": limits.cpu_s,
            "as": None if cg else limits.memory_mb * 2**20,
            "fsize": limits.file_size_mb * 2**20,
            "nproc": nproc,
        },
    }
    cmd = [view.python, "-I", "-S", "-c", _BOOT, json.dumps(cfg)]
    if mode == "bwrap":
        cmd = [*_bwrap_argv(caps.bwrap or "bwrap", limits.disk_mb), *cmd]
    elif mode == "unshare":
        cmd = [*_unshare_argv(caps.unshare or "unshare"), *cmd]
    launch = {"cgroup_procs": cg.procs_files if cg else [], "parent": os.getpid(), "status_fd": wfd}
    argv = [view.python, "-I", "-S", "-c", _LAUNCH, json.dumps(launch), *cmd]
    t0 = time.perf_counter()
    limit_hit: LimitName | None = None
    out = {"stdout": bytearray(), "stderr": bytearray()}
    proc = None
    finished = False
    tasks: list[asyncio.Task] = []
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(wfd, memfd),
            start_new_session=True,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            cwd="/",
        )
        os.close(wfd)
        os.close(memfd)
        wfd = memfd = -1
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
            asyncio.create_task(pump(proc.stdout, "stdout")),  # type: ignore[arg-type]
            asyncio.create_task(pump(proc.stderr, "stderr")),  # type: ignore[arg-type]
        ]
        waiter = asyncio.create_task(proc.wait())
        over_task = asyncio.create_task(over.wait())
        tasks = [*pumps, waiter, over_task]
        done, _ = await asyncio.wait(
            {waiter, over_task}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter not in done:
            limit_hit = "output" if over.is_set() else "wall"
            _kill(proc, cg, uid if mode == "weak" else None)
            await asyncio.wait({waiter}, timeout=10)
        _kill(proc, cg, uid if mode == "weak" else None)  # stragglers
        await asyncio.wait(pumps, timeout=0.5)
        duration = time.perf_counter() - t0
        os.set_blocking(rfd, False)
        try:
            lines = os.read(rfd, 65536).decode(errors="replace").splitlines()
        except BlockingIOError:
            lines = []
        report: dict = {}
        for line in lines:
            with contextlib.suppress(ValueError):
                report.update(json.loads(line))
        oom = cg.oom_kills() if cg else 0
        refused = cg.fork_refusals() if cg else 0
        peak = cg.peak_memory_bytes() if cg else None
        throttled = cg.cpu_throttled_s() if cg else None
        finished = True
    finally:
        for t in tasks:
            t.cancel()
        if proc is not None and not finished:  # cancelled or failed: nothing may outlive the call
            _kill(proc, cg, uid if mode == "weak" else None)
        for fd in (rfd, wfd, memfd):
            if fd >= 0:
                os.close(fd)
        if base:
            shutil.rmtree(base, ignore_errors=True)
        if cg is not None and not finished:
            cg.remove_later()
    if cg is not None:
        await asyncio.to_thread(cg.remove)
    if "setup_error" in report:
        raise ToolError(f"the sandbox could not start: {report['setup_error']}")
    exit_code, sig = report.get("exit"), report.get("signal")
    if limit_hit is None and (exit_code != 0 or sig is not None):
        limit_hit = _classify(report, limits, oom_kills=oom, fork_refusals=refused)
    if mode == "weak":
        log.warning("python sandbox ran with weak isolation (rlimits only)")
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
        mode=mode,
        weak_isolation=mode == "weak",
        per_process_limits=per_process,
        peak_memory_mb=None if peak is None else round(peak / 2**20, 1),
        cpu_throttled_s=None if throttled is None else round(throttled, 3),
    )


def _kill(proc: asyncio.subprocess.Process, cg: cgroup.CallCgroup | None, uid: int | None) -> None:
    """SIGKILL the launcher's process group, everything in the call's cgroup, and (weak mode, root)
    every process of the sandbox uid. Synchronous: it also runs on cancellation."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if cg is not None:
        cg.kill()
    if uid is not None:
        _kill_uid(uid)


def run_python(
    code: str, limits: SandboxLimits | None = None, *, files: Mapping[str, str | bytes] | None = None
) -> SandboxResult:
    """Synchronous :func:`arun_python` (usable from inside a running event loop too)."""
    return run_sync(arun_python(code, limits, files=files))


__all__ = [
    "SandboxCapabilities",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "arun_python",
    "choose_isolation",
    "probe_isolation",
    "remove_stale",
    "require_isolation",
    "run_python",
    "sandbox_capabilities",
]
