"""Rewards: functions of a trajectory (or of a whole group), combined with weights.

- :mod:`~flowgrpo.rewards.base`: the protocols, the :class:`Reward` base class, the registry and
  :class:`CompositeReward` (the weighted sum that fills ``traj.reward`` and ``traj.reward_breakdown``).
- :mod:`~flowgrpo.rewards.answers`: ``accuracy`` (math by value, text by EM/F1, code by hidden
  tests) and ``format``.
- :mod:`~flowgrpo.rewards.cost`: ``turn_cost``, a price on the turns of a correct episode.
- :mod:`~flowgrpo.rewards.code`: the hidden tests of code tasks, run in :mod:`flowgrpo.sandbox.python`.
- :mod:`~flowgrpo.rewards.judge`: ``judge``, an LLM grading the transcript.
- :mod:`~flowgrpo.rewards.diversity`: ``diversity``, a group reward against similar responses.
- :mod:`~flowgrpo.rewards.reward_model`: ``reward_model``, a learned sequence-classifier reward model.
- :mod:`~flowgrpo.rewards.verifier`: ``verifier``, a verifier model's P(Yes) that the answer is right.

These are the rewards of the seed diagrams (GSM8K GRPO with a "Math Acc", "Format", "DJ-Quality"
LLM scorer and an embedding "Diversity" reward). ``make_reward(name, **kwargs)`` builds any of them
by name; ``register_reward`` adds more.
"""

from __future__ import annotations

from flowgrpo.rewards.answers import (
    AccuracyReward,
    AnswerType,
    FormatReward,
    exact_match,
    f1_score,
    math_equal,
    normalize_math,
    normalize_text,
    parse_number,
)
from flowgrpo.rewards.base import (
    CompositeReward,
    GroupRewardFn,
    Missing,
    Reward,
    RewardFn,
    RewardSpec,
    Score,
    UnknownRewardError,
    as_score,
    final_answer,
    final_text,
    list_rewards,
    make_reward,
    register_reward,
)
from flowgrpo.rewards.code import CodeGrade, extract_code, grade_code, run_code_tests
from flowgrpo.rewards.cost import TurnCostReward
from flowgrpo.rewards.diversity import (
    DiversityReward,
    Embedder,
    PolicyHiddenStateEmbedder,
    diversity_scores,
    minilm_embedder,
)
from flowgrpo.rewards.judge import (
    JUDGE_TEMPLATE,
    ChatClient,
    HFChatClient,
    JudgeCallError,
    JudgeReward,
    OpenAIChatClient,
    parse_score,
    render_transcript,
)
from flowgrpo.rewards.reward_model import RewardModelReward
from flowgrpo.rewards.verifier import VERIFIER_TEMPLATE, HFVerifier, OpenAIVerifier, VerifierReward
from flowgrpo.types import Message

register_reward("accuracy", AccuracyReward)
register_reward("format", FormatReward)
register_reward("judge", JudgeReward, places_model=True)
register_reward("diversity", DiversityReward)
register_reward("verifier", VerifierReward, places_model=True)
register_reward("reward_model", RewardModelReward, places_model=True)
register_reward("turn_cost", TurnCostReward)

__all__ = [
    "JUDGE_TEMPLATE",
    "VERIFIER_TEMPLATE",
    "AccuracyReward",
    "AnswerType",
    "ChatClient",
    "CodeGrade",
    "CompositeReward",
    "DiversityReward",
    "Embedder",
    "FormatReward",
    "GroupRewardFn",
    "HFChatClient",
    "HFVerifier",
    "JudgeCallError",
    "JudgeReward",
    "Message",
    "Missing",
    "OpenAIChatClient",
    "OpenAIVerifier",
    "PolicyHiddenStateEmbedder",
    "Reward",
    "RewardFn",
    "RewardModelReward",
    "RewardSpec",
    "Score",
    "TurnCostReward",
    "UnknownRewardError",
    "VerifierReward",
    "as_score",
    "diversity_scores",
    "exact_match",
    "extract_code",
    "f1_score",
    "final_answer",
    "final_text",
    "grade_code",
    "list_rewards",
    "make_reward",
    "math_equal",
    "minilm_embedder",
    "normalize_math",
    "normalize_text",
    "parse_number",
    "parse_score",
    "register_reward",
    "render_transcript",
    "run_code_tests",
]
