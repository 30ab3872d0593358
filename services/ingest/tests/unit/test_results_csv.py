"""The results CSV: OpenAI's columns first, the platform's after, one row per step."""

import csv
import io
import math

import pytest

from whetstone.ingest.domain.results import COLUMNS, OPENAI_COLUMNS, checkpoint_values, progress_values, results_csv

pytestmark = pytest.mark.unit


def test_openai_columns_first_and_empty_cells_where_a_step_has_no_figure():
    rows = [(2, 1, {"train_loss": 1.25, "valid_loss": 1.5, "tokens_seen": 300.0}),
            (1, 1, {"train_loss": 2.0, "train_accuracy": 0.125, "learning_rate": 2e-4})]
    parsed = list(csv.DictReader(io.StringIO(results_csv(rows))))
    assert tuple(parsed[0]) == COLUMNS and COLUMNS[:5] == OPENAI_COLUMNS == (
        "step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy")
    assert [r["step"] for r in parsed] == ["1", "2"]
    assert parsed[0]["train_accuracy"] == "0.125" and parsed[0]["valid_loss"] == ""
    assert parsed[1]["valid_loss"] == "1.5" and parsed[1]["tokens_seen"] == "300" and parsed[1]["attempt"] == "1"
    assert float(parsed[0]["learning_rate"]) == 2e-4


def test_figures_taken_from_progress_and_checkpoint_events():
    got = progress_values({"loss": 1.0, "token_accuracy": 0.5, "validation_loss": None, "epoch": 1,
                           "grad_norm": math.nan, "step": 3, "attempt": 1})
    assert got == {"train_loss": 1.0, "train_accuracy": 0.5, "epoch": 1.0}
    assert checkpoint_values({"validation_loss": 0.75, "valid_mean_token_accuracy": 0.25, "other": 1.0}) == \
        {"valid_loss": 0.75, "valid_mean_token_accuracy": 0.25}
