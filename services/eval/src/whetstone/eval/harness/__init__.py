"""Outcome-quality harness: a tiny base model taught known skills, and planted candidates fine-tuned
from it (good and each bad kind), so the gate can be checked against a known truth."""
