"""flowgrpo: train tool-using LLM agents with multi-turn Flow-GRPO.

Importing the package is cheap: torch-heavy and optional packages (vllm, peft,
sentence_transformers, ray) are imported lazily by the modules that need them.
"""

from flowgrpo.types import (
    SCHEMA_VERSION,
    Message,
    Task,
    Termination,
    ToolCall,
    Trajectory,
    TrajectoryGroup,
    Turn,
)

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "Message",
    "Task",
    "Termination",
    "ToolCall",
    "Trajectory",
    "TrajectoryGroup",
    "Turn",
    "__version__",
]
