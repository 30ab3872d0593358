"""Serving: one shared base model per process, many LoRA adapters, OpenAI-compatible API."""
