"""Environments, tools and rewards named as module:attr or path/to/file.py:attr, and entry points
that name ready-made objects (a @tool function) or rewards."""

from __future__ import annotations

import textwrap
from importlib.metadata import EntryPoint

import pytest

from flowgrpo import env as env_mod
from flowgrpo import tool as tool_mod
from flowgrpo.cli import main
from flowgrpo.rewards import base as rewards_base
from flowgrpo.rewards import make_reward
from flowgrpo.utils.plugins import PluginError, is_factory, is_spec, load_object

PLUGIN = textwrap.dedent(
    '''
    from flowgrpo.env import ToolEnv
    from flowgrpo.tool import tool


    @tool
    def add(a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first.
            b: the second.
        """
        return str(a + b)


    class AddEnv(ToolEnv):
        """Adds numbers."""

        name = "add_env"

        def __init__(self, bonus: int = 0):
            super().__init__(tools=[add])
            self.bonus = bonus


    def exact(traj, task):
        return 1.0


    def scaled(scale: float = 2.0):
        return lambda traj, task: scale
    '''
)


@pytest.fixture
def plugin_file(tmp_path, monkeypatch):
    path = tmp_path / "my_plugin.py"
    path.write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def test_specs_are_told_apart_from_registered_names():
    assert is_spec("pkg.mod:Attr") and is_spec("./dir/file.py:fn")
    assert not is_spec("arithmetic") and not is_spec("http://x") and not is_spec("a:")
    with pytest.raises(PluginError, match="no attribute 'nope'"):
        load_object("flowgrpo.tool:nope")
    with pytest.raises(PluginError, match="does not exist"):
        load_object("/no/such/file.py:x")


def test_env_tool_and_reward_from_a_file_and_from_a_module(plugin_file):
    env = env_mod.make(f"{plugin_file}:AddEnv", bonus=3)
    assert env.bonus == 3 and [t.name for t in env.tools] == ["add"]
    assert env_mod.make("my_plugin:AddEnv").bonus == 0
    assert tool_mod.make_tool(f"{plugin_file}:add").name == "add"
    assert make_reward("my_plugin:exact")(None, None) == 1.0  # a (traj, task) function is the reward
    assert make_reward("my_plugin:scaled", scale=0.5)(None, None) == 0.5  # a factory is called
    with pytest.raises(PluginError, match="takes no arguments"):
        make_reward("my_plugin:exact", scale=1)


def test_a_tool_object_registered_as_an_entry_point_works(plugin_file, monkeypatch, capsys):
    ep = EntryPoint(name="adder", value="my_plugin:add", group=tool_mod.ENTRY_POINT_GROUP)
    real = tool_mod.entry_points
    monkeypatch.setattr(
        tool_mod,
        "entry_points",
        lambda group: [*real(group=group), ep] if group == ep.group else real(group=group),
    )
    assert tool_mod.make_tool("adder").name == "add"
    assert main(["tools"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("adder"))
    assert "Add two integers." in line and "(args: a, b)" in line


def test_rewards_have_an_entry_point_group(plugin_file, monkeypatch):
    ep = EntryPoint(name="always_one", value="my_plugin:exact", group="flowgrpo.rewards")
    monkeypatch.setattr(
        rewards_base, "entry_points", lambda group: [ep] if group == "flowgrpo.rewards" else []
    )
    assert "always_one" in rewards_base.list_rewards()
    assert make_reward("always_one")(None, None) == 1.0


def test_is_factory_tells_a_reward_function_from_a_factory():
    def reward(traj, task): ...
    def factory(scale: float = 1.0): ...
    def kw_only(*, url): ...

    assert not is_factory(reward) and is_factory(factory) and is_factory(kw_only) and is_factory(dict)


def test_a_config_names_its_environment_by_file(plugin_file, tmp_path):
    from flowgrpo.components import build
    from flowgrpo.config import load_config

    cfg = load_config(
        None, [f"env.name={plugin_file}:AddEnv", "model.name=tiny", f"run.output_dir={tmp_path}/r"]
    )
    parts = build(cfg)
    assert [t.name for t in parts.env_factory().tools] == ["add"]
