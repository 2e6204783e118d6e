"""How counts and shares read: one of a thing in the singular ("1 row", never "1 rows" nor
"all 1 link"), and a share finer than a whole percent as given (0.5%, never 0%)."""

from __future__ import annotations

import pytest

from distbench.core import noise
from distbench.core.tables import percent, plural
from distbench.results import healthy


@pytest.mark.parametrize("count,want", [(0, "0 rows"), (1, "1 row"), (2, "2 rows")])
def test_plural_is_singular_for_one_only(count, want):
    assert plural(count, "row") == want


def test_plural_takes_a_plural_of_its_own():
    assert plural(1, "GPU") == "1 GPU" and plural(8, "GPU") == "8 GPUs"
    assert plural(1, "process", "processes") == "1 process"
    assert plural(3, "process", "processes") == "3 processes"


@pytest.mark.parametrize("share,want", [
    (0.05, "5%"), (0.07, "7%"), (0.005, "0.5%"), (0.125, "12.5%"), (0.0001, "0.01%"),
    (0.0, "0%"), (0.999, "99.9%"), (1 / 3, "33.3333%")])
def test_percent_keeps_what_a_threshold_was_given_with(share, want):
    assert percent(share) == want


def test_percent_to_fewer_places_rounds():
    assert percent(0.6913, 0) == "69%" and percent(0.0072, 1) == "0.7%"


def test_noise_notes_name_a_fine_threshold_and_the_noise_as_finely():
    """0.7% of noise against a 0.5% threshold read "1% apart, more than the 0% threshold"."""
    same = noise.judge(1.002, 0.005, [0.007])
    assert (same.mark, same.note) == ("noisy", "noisy: repetitions 0.7% apart, more than the "
                                               "0.5% threshold")
    within = noise.judge(1.01, 0.005, [0.012])
    assert (within.mark, within.note) == ("noisy", "within the noise: repetitions 1.2% apart")
    # a whole-percent threshold keeps whole percents, as the docs show them
    assert noise.judge(1.02, 0.05, [0.6913]).note == ("noisy: repetitions 69% apart, more than "
                                                      "the 5% threshold")


def test_the_median_of_one_item_is_not_of_all_1():
    got = healthy.reach([(5.0, frozenset({"a", "b"}))], noun=("link", "links"))
    assert (got.value, got.basis) == (5.0, "median of the 1 link")
    two = healthy.reach([(5.0, frozenset({"a", "b"})), (7.0, frozenset({"a", "b"}))],
                        noun=("link", "links"))
    assert two.basis == "median of all 2 links"
