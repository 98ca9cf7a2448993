"""The keyword that hands a KV cache to a transformers model's ``forward``.

transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name still works there, with a
``FutureWarning`` per call, and goes in 5.40); earlier versions know only ``past_key_values``. The
decode loop and the shared-prefix logprob pass call ``forward`` with ``**cache_kwargs(cache)``.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

_MAJOR_MINOR = tuple(int(part) for part in version("transformers").split(".")[:2])
CACHE_KEYWORD = "cache" if _MAJOR_MINOR >= (5, 24) else "past_key_values"


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """``{"cache": cache}`` on transformers >= 5.24, else ``{"past_key_values": cache}``."""
    return {CACHE_KEYWORD: cache}
