"""The error every layer raises for a setting that cannot be used.

It lives below the layers that check settings (the device resolver in :mod:`flowgrpo.modeling`, the
config schema in :mod:`flowgrpo.config`) so that each can raise it; users import it as
``flowgrpo.config.ConfigError``. The CLI prints its message as one line and exits 2.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says how to fix it."""
