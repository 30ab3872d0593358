"""The gang's data order (recipes/gang_order.py): Accelerate's permutation, then the blank examples."""

import pytest
from whetstone.trainer_agent.recipes.gang_order import BLANK_LINE, IGNORE_INDEX, GangOrder, blank_example, blanks_needed

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("examples", "per_step", "blanks"), [(40, 4, 0), (38, 4, 2), (37, 4, 3), (1, 8, 7), (16, 8, 0)])
def test_blanks_fill_the_last_global_step_only(examples, per_step, blanks):
    assert blanks_needed(examples, per_step) == blanks
    assert (examples + blanks) % per_step == 0 and blanks < per_step


def test_a_blank_example_has_no_target_and_no_source_line():
    blank = blank_example(pad_id=3)
    assert blank == {"input_ids": [3], "labels": [IGNORE_INDEX], "line": BLANK_LINE}


def test_the_order_is_accelerates_permutation_of_the_real_examples_then_the_blanks_epoch_by_epoch():
    from accelerate.data_loader import SeedableRandomSampler

    for real in (7, 38):
        reference = SeedableRandomSampler(data_source=range(real), data_seed=5)
        gang = GangOrder(real, real + 2, initial_seed=5)
        assert len(gang) == real + 2
        orders = []
        for _ in range(3):   # each full pass moves both to the next epoch's seed
            expected, got = list(reference), list(gang)
            assert got == expected + [real, real + 1]
            orders.append(got)
        assert orders[0] != orders[1]
        gang.set_epoch(1)    # the Trainer sets the epoch on resume: the same order as that epoch's first pass
        assert list(gang) == orders[1]
