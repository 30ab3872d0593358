"""Grader objects in OpenAI's shape that tests hand to the platform."""

from __future__ import annotations

from typing import Any

# 0.8 for the exact answer, 0.2 for how close the text is to it (fuzzy_match): a reward that is
# never all-or-nothing, in `item.answer`'s terms
EXACT_OR_CLOSE: dict[str, Any] = {
    "type": "multi", "name": "reward", "calculate_output": "0.8 * exact + 0.2 * close", "graders": {
        "exact": {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
                  "reference": "{{item.answer}}", "operation": "eq"},
        "close": {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
                  "reference": "{{item.answer}}", "evaluation_metric": "fuzzy_match"}}}
