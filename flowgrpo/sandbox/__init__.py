"""Running untrusted or unbounded work in a limited process.

- :mod:`~flowgrpo.sandbox.python`: the Python sandbox for model-written code (namespaces, rlimits).
- :mod:`~flowgrpo.sandbox.cgroup`: one control group per sandbox call (memory, processes).
- :mod:`~flowgrpo.sandbox.bounded`: pure functions under a time budget in a killable worker.

May import: :mod:`flowgrpo.tool` (its ``ToolError``), :mod:`flowgrpo.utils`, :mod:`flowgrpo.types`.
"""
