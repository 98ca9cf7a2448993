"""Built-in tools (installed as ``flowgrpo.tools``)."""
