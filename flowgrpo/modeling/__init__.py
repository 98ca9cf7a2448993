"""The policy as a model: loading it, its precision, its log-probabilities, LoRA, weight handoff.

- :mod:`~flowgrpo.modeling.models`: the embedded model, GGUF and Hugging Face loading, tiny test models.
- :mod:`~flowgrpo.modeling.hardware`: what the hardware is good at (``autocast: auto``).
- :mod:`~flowgrpo.modeling.logprobs`: per-token log-probabilities and entropies of packed rows.
- :mod:`~flowgrpo.modeling.kvcache`: the keyword that hands a KV cache to ``forward``.
- :mod:`~flowgrpo.modeling.lora`: LoRA adapters through peft.
- :mod:`~flowgrpo.modeling.weightsync`: the trainer's weights handed to a served policy.

May import: :mod:`flowgrpo.utils`, :mod:`flowgrpo.types`, torch and transformers.
"""
