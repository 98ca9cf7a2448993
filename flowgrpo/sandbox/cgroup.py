"""One control group per sandbox call: memory, process and CPU limits for the whole call, not per process.

rlimits bound each process on its own (32 processes x ``RLIMIT_AS`` 1 GB is 32 GB); a cgroup bounds
their sum, charges shared memory, tmpfs files and memfds to the call, confines the OOM killer to the
call's processes, and counts what the kernel refused (``oom_kill``, ``pids.events max``), which is how
the sandbox classifies a limit without trusting anything the code printed. Where the ``cpu``
controller is available too, the call gets a CPU share (``cpu.max`` on v2, ``cpu.cfs_quota_us`` on v1):
without it one call may take every core of the host for its whole wall-clock limit.

Both hierarchies are supported (kernel docs: admin-guide/cgroup-v2.rst, cgroup-v1/memory.rst, pids.rst):

- **v2**: a child of our own cgroup, when ``memory`` and ``pids`` are (or can be) enabled in its
  ``cgroup.subtree_control``: the root cgroup (containers with a cgroup namespace), or a delegated
  subtree whose processes do not live in the delegating cgroup itself (``systemd-run --user -p
  Delegate=yes``, with the trainer in a leaf).
- **v1**: a child of our own cgroup in the ``memory`` and ``pids`` hierarchies, when we may create one
  (root, or a directory delegated by ``chown``).

Groups are named ``flowgrpo-sandbox-<pid>-<n>``; :func:`remove_stale` kills and removes those whose
creator is no longer alive (a trainer killed with SIGKILL cannot clean up after itself).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Literal

PREFIX = "flowgrpo-sandbox-"
_counter = itertools.count()
_STALE = re.compile(PREFIX + r"(\d+)-")


@dataclass(frozen=True)
class CgroupParents:
    """Where per-call groups can be created: one directory (v2) or one per controller (v1)."""

    version: Literal[1, 2]
    memory: str
    pids: str
    cpu: str | None = None  # None: no cpu controller here (a call's CPU share is then unbounded)


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if rfields and rfields[0] in ("cgroup", "cgroup2"):
                opts = set(rfields[2].split(",")) if len(rfields) > 2 else set()
                out.append((fields[4], rfields[0], opts))
    return out


def _own_paths() -> dict[str, str]:
    """Controller (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _writable_dir(path: str) -> bool:
    probe = os.path.join(path, f"{PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return True


def _v2_parent(mount: str, own: str) -> tuple[str, bool] | None:
    """Our v2 cgroup, if per-call children with memory and pids limits can be made in it, and
    whether they get the ``cpu`` controller too (optional: a host may not delegate it)."""
    base = os.path.join(mount, own.lstrip("/"))
    control = os.path.join(base, "cgroup.subtree_control")
    try:
        with open(os.path.join(base, "cgroup.controllers")) as f:
            available = set(f.read().split())
        if not {"memory", "pids"} <= available:
            return None
        with open(control) as f:
            enabled = set(f.read().split())
        if not {"memory", "pids"} <= enabled:
            # Refused (EBUSY) when our cgroup holds processes and is not the root: v2's
            # "no internal processes" rule. Then there is no place for per-call groups.
            with open(control, "w") as f:
                f.write("+memory +pids")
        if "cpu" in available and "cpu" not in enabled:
            with contextlib.suppress(OSError), open(control, "w") as f:
                f.write("+cpu")
        with open(control) as f:
            cpu = "cpu" in f.read().split()
    except OSError:
        return None
    return (base, cpu) if _writable_dir(base) else None


@functools.lru_cache(maxsize=1)
def find_parents() -> CgroupParents | None:
    """Where this process may create per-call groups, or None (then limits stay per process)."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError:
        return None
    v1 = {c: m for m, t, opts in mounts if t == "cgroup" for c in ("memory", "pids", "cpu") if c in opts}
    if "memory" in v1 and "pids" in v1 and "memory" in own and "pids" in own:
        mem = os.path.join(v1["memory"], own["memory"].lstrip("/"))
        pids = os.path.join(v1["pids"], own["pids"].lstrip("/"))
        cpu = os.path.join(v1["cpu"], own["cpu"].lstrip("/")) if "cpu" in v1 and "cpu" in own else None
        if _writable_dir(mem) and _writable_dir(pids):
            return CgroupParents(1, mem, pids, cpu if cpu and _writable_dir(cpu) else None)
    for m, t, _ in mounts:
        if t == "cgroup2" and "" in own:
            found = _v2_parent(m, own[""])
            if found:
                base, cpu_ok = found
                return CgroupParents(2, base, base, base if cpu_ok else None)
    return None


# The CFS period a CPU quota is expressed over (the kernel's default): a call with ``cpus=1`` may run
# 100 ms of CPU time in every 100 ms of wall time, spread over any number of cores.
CPU_PERIOD_US = 100_000


class CallCgroup:
    """The control group of one sandbox call (created with its limits; remove it when done).

    ``cpus``: the call's CPU share in cores (None: unbounded); applied only where ``parents.cpu``
    exists (:attr:`cpu_limited` says whether it was)."""

    def __init__(
        self, parents: CgroupParents, *, memory_bytes: int, max_pids: int, cpus: float | None = None
    ) -> None:
        name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.version = parents.version
        self.memory_dir = os.path.join(parents.memory, name)
        self.pids_dir = os.path.join(parents.pids, name)
        self.cpu_dir = os.path.join(parents.cpu, name) if parents.cpu and cpus is not None else None
        self.dirs = sorted({self.memory_dir, self.pids_dir, *([self.cpu_dir] if self.cpu_dir else [])})
        for d in self.dirs:
            os.mkdir(d)
        try:
            if self.version == 2:
                self._write(self.memory_dir, "memory.max", str(memory_bytes))
                with contextlib.suppress(OSError):  # absent without swap accounting
                    self._write(self.memory_dir, "memory.swap.max", "0")
            else:
                self._write(self.memory_dir, "memory.limit_in_bytes", str(memory_bytes))
                with contextlib.suppress(OSError):
                    self._write(self.memory_dir, "memory.memsw.limit_in_bytes", str(memory_bytes))
            self._write(self.pids_dir, "pids.max", str(max_pids))
            if self.cpu_dir is not None and cpus is not None:
                quota = max(1000, round(cpus * CPU_PERIOD_US))  # the kernel's smallest quota is 1 ms
                if self.version == 2:
                    self._write(self.cpu_dir, "cpu.max", f"{quota} {CPU_PERIOD_US}")
                else:
                    self._write(self.cpu_dir, "cpu.cfs_period_us", str(CPU_PERIOD_US))
                    self._write(self.cpu_dir, "cpu.cfs_quota_us", str(quota))
        except BaseException:
            self.remove()
            raise

    @staticmethod
    def _write(d: str, name: str, value: str) -> None:
        with open(os.path.join(d, name), "w") as f:
            f.write(value)

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join the group."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def _read_kv(self, d: str, name: str) -> dict[str, int]:
        try:
            with open(os.path.join(d, name)) as f:
                return {k: int(v) for k, v in (line.split() for line in f if len(line.split()) == 2)}
        except (OSError, ValueError):
            return {}

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer killed in this group (its memory limit was reached)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return self._read_kv(self.memory_dir, name).get("oom_kill", 0)

    def fork_refusals(self) -> int:
        """Forks the kernel refused because ``pids.max`` was reached."""
        return self._read_kv(self.pids_dir, "pids.events").get("max", 0)

    @property
    def cpu_limited(self) -> bool:
        """Whether the call's CPU share is bounded by this group."""
        return self.cpu_dir is not None

    def cpu_throttled_s(self) -> float | None:
        """Seconds the kernel held the call's processes back to keep it within its CPU share."""
        if self.cpu_dir is None:
            return None
        stat = self._read_kv(self.cpu_dir, "cpu.stat")
        if self.version == 2:
            return stat["throttled_usec"] / 1e6 if "throttled_usec" in stat else None
        return stat["throttled_time"] / 1e9 if "throttled_time" in stat else None

    def peak_memory_bytes(self) -> int | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            with open(os.path.join(self.memory_dir, name)) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError, ValueError), open(f) as fh:
                out.update(int(x) for x in fh.read().split())
        return sorted(out)

    def kill(self) -> None:
        """SIGKILL every process in the group (``cgroup.kill`` on v2, else repeatedly by pid)."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                self._write(self.pids_dir, "cgroup.kill", "1")
                return
        for _ in range(50):  # pids.max bounds how many can appear between two passes
            pids = self.pids()
            if not pids:
                return
            for p in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.002)

    def remove(self, *, wait_s: float = 1.0) -> bool:
        """Remove the group's directories (after killing what is left); True when all are gone."""
        deadline = time.monotonic() + wait_s
        while True:
            self.kill()
            left = []
            for d in self.dirs:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:  # EBUSY until killed processes are reaped
                    left.append(d)
            if not left or time.monotonic() > deadline:
                return not left
            time.sleep(0.01)

    def remove_later(self) -> None:
        """Remove the group in a background thread (for exit paths that must not block)."""
        if not self.remove(wait_s=0):
            threading.Thread(target=self.remove, kwargs={"wait_s": 10.0}, daemon=True).start()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(parents: CgroupParents) -> int:
    """Kill and remove groups left by sandboxes whose creator died; returns how many were removed."""
    removed = 0
    for parent in sorted({parents.memory, parents.pids, *([parents.cpu] if parents.cpu else [])}):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            m = _STALE.match(name)
            if not m or pid_alive(int(m.group(1))):
                continue
            d = os.path.join(parent, name)
            for _ in range(100):
                try:
                    with open(os.path.join(d, "cgroup.procs")) as f:
                        pids = [int(x) for x in f.read().split()]
                except (OSError, ValueError):
                    pids = []
                for p in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(p, signal.SIGKILL)
                try:
                    os.rmdir(d)
                    removed += 1
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
    return removed


__all__ = [
    "CPU_PERIOD_US",
    "PREFIX",
    "CallCgroup",
    "CgroupParents",
    "find_parents",
    "pid_alive",
    "remove_stale",
]
