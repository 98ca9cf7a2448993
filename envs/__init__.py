"""Built-in environments (installed as ``flowgrpo.envs``)."""
