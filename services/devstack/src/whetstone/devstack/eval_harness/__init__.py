"""The eval gate's outcome-quality harness (test and bench support, not part of the eval service): a
tiny base model taught known skills, planted candidates fine-tuned from it (good and each bad kind),
a reference-guided judge server and a score cache in files, so the gate can be checked against a known
truth (`bench/eval.py`, `services/eval/tests/integration/test_planted_candidates.py`)."""
