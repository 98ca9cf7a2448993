"""Rollout backends: hf (transformers), openai (HTTP), vllm (optional)."""
