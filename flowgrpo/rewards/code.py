"""Code answers: the task's hidden tests grade the answer in the sandbox; the answer cannot forge the verdict.

When the answer and the tests share one program (answer, then asserts, then a printed pass marker),
the answer controls the process that decides its reward: it can print the marker, ``sys.exit(0)``
before the tests, patch ``builtins``/``unittest``, return an object whose ``__eq__`` always says yes,
or read the tests from disk. Here they never share a process or a file the answer can reach. One
sandbox call (:func:`flowgrpo.sandbox.python.arun_python`) runs two processes:

- the **grader** (the sandbox's main program; trusted code): makes itself non-dumpable (the answer's
  process, same uid, can then neither ptrace it nor open its ``/proc`` files), reads the tests and a
  one-time key from ``grading.json`` and deletes the file, starts the answer's process, runs the tests
  with every name the answer defines bound to a proxy, and writes ``{"verdict": "pass", "key": KEY}``
  on its own stdout (held by no other process of the call) only when the tests ran to their end.
- the **answer's process**: imports ``answer.py`` and serves calls over two pipes. Arguments and
  results cross as plain data (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``,
  ``bytearray``, ``list``, ``tuple``, ``dict``, ``set``, ``frozenset``, ``range``, ``Fraction``,
  ``Decimal``; subclasses become their base type, iterators a list iterator) that the grader decodes
  into fresh built-in objects, so nothing the answer defines runs in the grader. Exceptions cross by
  name (built-in ``Exception`` subclasses, else ``AnswerError``); in-place changes to list, dict, set
  and bytearray arguments are copied back.

The reward is 1 only when the grader exited 0, no limit was hit, and its stdout is the verdict with
the key (:func:`grade_code`). The task data are not in the sandbox's view (:mod:`flowgrpo.sandbox.python`).
Not supported: tests that pass functions or objects of their own to the answer, or receive instances
of classes the answer defines (they fail with a ``TypeError`` naming the type).
"""

from __future__ import annotations

import hmac
import json
import re
import secrets

from pydantic import BaseModel, ConfigDict

from flowgrpo.sandbox.python import SandboxLimits, SandboxResult, arun_python

# Encoding shared by the grader and the answer's process. ``enc`` turns plain data into JSON-able
# tagged values; ``dec`` accepts only those tags and builds fresh built-in objects (the grader never
# runs a method of an object the answer made).
_CODEC = r'''
import base64 as _b64, collections.abc as _abc, decimal as _dec, fractions as _frac
class AnswerError(Exception):
    """An exception of a type the grader does not know, raised by the answer."""
def enc(x, d=0):
    if d > 100:
        raise ValueError("data nested more than 100 deep cannot cross to the grader")
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str(x)
    for t, tag in ((list, "list"), (tuple, "tuple"), (frozenset, "frozenset"), (set, "set")):
        if isinstance(x, t):
            return {tag: [enc(i, d + 1) for i in x]}
    if isinstance(x, dict):
        return {"dict": [[enc(k, d + 1), enc(v, d + 1)] for k, v in x.items()]}
    if isinstance(x, bytearray):
        return {"bytearray": _b64.b64encode(bytes(x)).decode()}
    if isinstance(x, bytes):
        return {"bytes": _b64.b64encode(bytes(x)).decode()}
    if isinstance(x, complex):
        return {"complex": [float(x.real), float(x.imag)]}
    if isinstance(x, range):
        return {"range": [int(x.start), int(x.stop), int(x.step)]}
    if isinstance(x, _frac.Fraction):
        return {"fraction": [int(x.numerator), int(x.denominator)]}
    if isinstance(x, _dec.Decimal):
        return {"decimal": str(x)}
    if isinstance(x, _abc.Iterator):
        return {"iter": [enc(i, d + 1) for i in x]}
    raise TypeError("a value of type %s cannot cross between the answer and the tests: plain data only "
                    "(None, bool, int, float, complex, str, bytes, list, tuple, dict, set, range)" % type(x).__name__)
def _items(v):
    if type(v) is not list:
        raise ValueError("malformed value from the other process")
    return v
def dec(x, d=0):
    if d > 100:
        raise ValueError("data nested more than 100 deep")
    if x is None or type(x) in (bool, int, float, str):
        return x
    if type(x) is dict and len(x) == 1:
        (tag, v), = x.items()
        if tag == "list":
            return [dec(i, d + 1) for i in _items(v)]
        if tag == "tuple":
            return tuple(dec(i, d + 1) for i in _items(v))
        if tag == "set":
            return set(dec(i, d + 1) for i in _items(v))
        if tag == "frozenset":
            return frozenset(dec(i, d + 1) for i in _items(v))
        if tag == "iter":
            return iter([dec(i, d + 1) for i in _items(v)])
        if tag == "dict":
            out = {}
            for kv in _items(v):
                k, val = _items(kv)
                out[dec(k, d + 1)] = dec(val, d + 1)
            return out
        if tag in ("bytes", "bytearray") and type(v) is str:
            b = _b64.b64decode(v.encode(), validate=True)
            return b if tag == "bytes" else bytearray(b)
        if tag == "complex" and all(type(i) is float for i in _items(v)) and len(v) == 2:
            return complex(v[0], v[1])
        if tag == "range" and all(type(i) is int for i in _items(v)) and len(v) == 3:
            return range(*v)
        if tag == "fraction" and all(type(i) is int for i in _items(v)) and len(v) == 2:
            return _frac.Fraction(v[0], v[1])
        if tag == "decimal" and type(v) is str:
            return _dec.Decimal(v)
    raise ValueError("malformed value from the other process")
'''

# The answer's process: imports answer.py, then answers requests (one JSON line each) on its pipes.
_SERVE = (
    _CODEC
    + r"""
import importlib.util, json, os, sys, traceback, types
if hasattr(sys, "set_int_max_str_digits"):
    sys.set_int_max_str_digits(0)
rq = os.fdopen(int(sys.argv[1]), "rb")
rs = os.fdopen(int(sys.argv[2]), "wb")
def send(m):
    rs.write(json.dumps(m).encode() + b"\n")
    rs.flush()
def failure(e):
    try:
        return {"raise": type(e).__name__, "msg": str(e)[:2000]}
    except BaseException:
        return {"raise": "AnswerError", "msg": "(unprintable exception)"}
try:
    spec = importlib.util.spec_from_file_location("answer", "answer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["answer"] = mod
    spec.loader.exec_module(mod)
    import_error = None
except BaseException as e:
    traceback.print_exc()
    import_error = "%s: %s" % (type(e).__name__, e)
for line in rq:
    m = json.loads(line)
    if m["op"] == "names":
        if import_error is not None:
            send({"import_error": import_error})
            continue
        names = {}
        for k, v in list(vars(mod).items()):
            if k.startswith("__"):
                continue
            if isinstance(v, types.ModuleType):
                names[k] = {"kind": "module", "name": v.__name__}
            elif callable(v):
                names[k] = {"kind": "callable"}
            else:
                try:
                    names[k] = {"kind": "data", "value": enc(v)}
                except Exception:
                    pass
        send({"names": names})
    elif m["op"] == "call":
        try:
            args, kwargs = dec(m["args"]), dec(m["kwargs"])
            r = getattr(mod, m["name"])(*args, **kwargs)
            send({"ok": enc(r), "after": enc(args)})
        except BaseException as e:
            send(failure(e))
"""
)

# The grader: the sandbox's main program. It holds the key; the answer's process never sees it.
_GRADER = (
    _CODEC
    + r"""
import builtins, ctypes, importlib, json, os, subprocess, sys, traceback
if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0, before anything secret is read
    sys.exit("grader: could not make itself non-dumpable")
with open("grading.json", "rb") as f:
    G = json.loads(f.read())
os.unlink("grading.json")
if hasattr(sys, "set_int_max_str_digits"):
    sys.set_int_max_str_digits(0)
verdict_fd = os.dup(1)  # the verdict channel; not inherited, and the tests' prints go to stderr
os.dup2(2, 1)
req_r, req_w = os.pipe()
resp_r, resp_w = os.pipe()
answer = subprocess.Popen([sys.executable, "-I", "-B", "-X", "utf8", "-c", G["serve"], str(req_r), str(resp_w)],
                          stdin=subprocess.DEVNULL, stdout=2, stderr=2, pass_fds=(req_r, resp_w))
os.close(req_r)
os.close(resp_w)
to_answer, from_answer = os.fdopen(req_w, "wb"), os.fdopen(resp_r, "rb")
def ask(m):
    to_answer.write(json.dumps(m).encode() + b"\n")
    to_answer.flush()
    line = from_answer.readline(64 << 20)
    if not line.endswith(b"\n"):
        raise AnswerError("the answer's process ended or sent a malformed reply")
    r = json.loads(line)
    if type(r) is not dict:
        raise AnswerError("malformed reply from the answer's process")
    return r
def proxy(name):
    def call(*args, **kwargs):
        r = ask({"op": "call", "name": name, "args": enc(list(args)), "kwargs": enc(kwargs)})
        if "raise" in r:
            cls = getattr(builtins, str(r["raise"]), None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = AnswerError
            raise cls(str(r.get("msg", "")))
        if "ok" not in r:
            raise AnswerError("malformed reply from the answer's process")
        result, after = dec(r["ok"]), dec(r.get("after", {"list": []}))
        for a, b in zip(args, after if type(after) is list else []):  # in-place changes come back
            if type(a) is type(b) and a != b:
                if type(a) in (list, bytearray):
                    a[:] = b
                elif type(a) in (dict, set):
                    a.clear()
                    a.update(b)
        return result
    call.__name__ = call.__qualname__ = name
    return call
SKIP_MODULES = {"antigravity", "this"}
try:
    g = {"__name__": "__main__", "__builtins__": builtins}
    r = ask({"op": "names"})
    if "import_error" in r:
        raise AnswerError("the answer failed to import: %s" % str(r["import_error"])[:2000])
    names = r.get("names")
    if type(names) is not dict:
        raise AnswerError("malformed reply from the answer's process")
    for name, info in names.items():
        if not name.isidentifier() or hasattr(builtins, name) or type(info) is not dict:
            continue  # never let the answer shadow a builtin the tests use (abs, len, AssertionError, ...)
        kind = info.get("kind")
        if kind == "callable":
            g[name] = proxy(name)
        elif kind == "data":
            g[name] = dec(info.get("value"))
        elif kind == "module" and type(info.get("name")) is str:
            mod = info["name"]
            if mod.split(".")[0] in getattr(sys, "stdlib_module_names", ()) and mod.split(".")[0] not in SKIP_MODULES:
                try:
                    g[name] = importlib.import_module(mod)
                except Exception:
                    pass
    exec(compile(G["tests"], "tests", "exec"), g)
except BaseException as e:
    if not (isinstance(e, SystemExit) and e.code in (0, None)):
        traceback.print_exc()
        answer.kill()
        os.write(verdict_fd, b'{"verdict": "fail"}\n')
        os._exit(1)
answer.kill()
os.write(verdict_fd, (json.dumps({"verdict": "pass", "key": G["key"]}) + "\n").encode())
os._exit(0)
"""
)


class CodeGrade(BaseModel):
    """The verdict on one code answer, with the sandbox run that produced it."""

    model_config = ConfigDict(extra="forbid")
    passed: bool
    run: SandboxResult


def extract_code(text: str) -> str:
    """The code in an answer: the last fenced block if any, else the text itself."""
    blocks = re.findall(r"```(?:python|py)?[^\n]*\n(.*?)```", text, flags=re.S)
    return (blocks[-1] if blocks else text).strip("\n")


async def grade_code(
    code: str,
    tests: str,
    *,
    timeout_s: float = 10.0,
    allow_weak_isolation: bool = False,
    limits: SandboxLimits | None = None,
) -> CodeGrade:
    """Run ``tests`` against the answer ``code`` (module docstring) and read the grader's verdict.

    ``limits`` replaces the default ``SandboxLimits(wall_s=timeout_s, allow_weak_isolation=...)``.
    Raises :class:`flowgrpo.sandbox.python.SandboxUnavailableError` where no isolation works, unless weak
    isolation is allowed (the answer then runs as your user, sees your files and processes: the
    verdict is not protected)."""
    key = secrets.token_hex(32)
    grading = json.dumps({"tests": tests, "key": key, "serve": _SERVE})
    res = await arun_python(
        _GRADER,
        limits or SandboxLimits(wall_s=timeout_s, allow_weak_isolation=allow_weak_isolation),
        files={"answer.py": extract_code(code), "grading.json": grading},
    )
    expected = json.dumps({"verdict": "pass", "key": key}) + "\n"
    passed = (
        res.exit_code == 0
        and res.limit_hit is None
        and not res.truncated
        and hmac.compare_digest(res.stdout.encode(), expected.encode())
    )
    return CodeGrade(passed=passed, run=res)


async def run_code_tests(
    code: str, tests: str, *, timeout_s: float = 10.0, allow_weak_isolation: bool = False
) -> bool:
    """Whether ``code`` passes ``tests`` (:func:`grade_code`)."""
    grade = await grade_code(code, tests, timeout_s=timeout_s, allow_weak_isolation=allow_weak_isolation)
    return grade.passed
