"""Plugins named on the command line or in a config without registering them first.

An environment, tool or reward may be given as ``module:attr`` (an importable module) or
``path/to/file.py:attr`` (a local file, imported under a private module name) as well as a
registered name, the way ``uvicorn app:app`` or TRL's ``reward_funcs`` paths work.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any


class PluginError(ValueError):
    """A ``module:attr`` or ``file.py:attr`` that cannot be loaded; the message says why."""


class MissingExtraError(ImportError):
    """An optional dependency the configuration asks for is not installed; the message says how to
    install it or what to choose instead (the command line prints it as one line, not a traceback)."""


def is_spec(name: str) -> bool:
    """Whether ``name`` is a ``module:attr`` / ``file.py:attr`` reference rather than a registered name."""
    module, sep, attr = name.rpartition(":")
    return bool(sep and module and attr.isidentifier())


def load_object(spec: str) -> Any:
    """The object ``spec`` (``module:attr`` or ``path/to/file.py:attr``) names."""
    if not is_spec(spec):
        raise PluginError(f"{spec!r} is not of the form module:attr or path/to/file.py:attr")
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"{spec!r}: the file {path} does not exist")
        mod_name = f"flowgrpo_plugin_{path.stem}_{abs(hash(str(path))):x}"
        module = sys.modules.get(mod_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise PluginError(f"{spec!r}: {path} cannot be imported as a Python module")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module  # dataclasses and pickling look modules up here
            try:
                loader_spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[mod_name]
                raise PluginError(f"{spec!r}: importing {path} failed: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise PluginError(f"{spec!r}: cannot import module {where!r}: {e}") from e
    try:
        return getattr(module, attr)  # the attribute the user named, not a capability probe
    except AttributeError:
        raise PluginError(f"{spec!r}: module {where!r} has no attribute {attr!r}") from None


def is_factory(obj: Any) -> bool:
    """A class, or a function whose every parameter has a default or is keyword-only (so it is
    called with the config's kwargs to build the plugin); anything else is the plugin itself (a
    ``@tool`` object, a reward function of ``(traj, task)`` or ``(group)``)."""
    if isinstance(obj, type):
        return True
    if not inspect.isfunction(obj):
        return False
    required = [
        p
        for p in inspect.signature(obj).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return not required


def build(obj: Any, kwargs: dict[str, Any], *, what: str, name: str) -> Any:
    """``obj(**kwargs)`` for a factory, ``obj`` itself otherwise (then ``kwargs`` must be empty)."""
    if is_factory(obj):
        return obj(**kwargs)
    if kwargs:
        raise PluginError(
            f"{what} {name!r} is a ready-made object, not a factory: it takes no arguments (got {sorted(kwargs)})"
        )
    return obj


__all__ = ["PluginError", "build", "is_factory", "is_spec", "load_object"]
