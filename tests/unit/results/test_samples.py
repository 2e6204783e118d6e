"""The per-iteration samples file: its format, its thinning, and that a real run writes one line
per measured row (none for skipped rows) with the row's iteration count.
The tests that start processes: test_samples_multiproc.py."""

from __future__ import annotations

import pytest

from distbench.core.errors import ReadError
from distbench.results import samples


def test_thin_keeps_every_value_up_to_the_cap_then_evenly_spaced():
    assert samples.thin([1.0, 2.0, 3.0], kept=5) == [1.0, 2.0, 3.0]
    values = [float(i) for i in range(10_001)]
    kept = samples.thin(values, kept=1001)
    assert len(kept) == 1001
    assert kept[0] == 0.0 and kept[-1] == 10_000.0
    assert kept[1] == 10.0 and kept[500] == 5000.0  # even spacing


def test_encode_then_read_round_trips_to_four_significant_digits(tmp_path):
    path = tmp_path / "collective.samples.jsonl"
    path.write_text(samples.encode(0, [123.456789, 0.001234567], [123.456789, 0.001234567])
                    + samples.encode(2, [5.0]))
    assert samples.read(path) == {0: samples.Kept([123.5, 0.001235], [123.5, 0.001235]),
                                  2: samples.Kept([5.0], [])}


def test_a_line_cut_short_at_the_end_is_ignored_but_a_bad_line_inside_is_refused(tmp_path):
    path = tmp_path / "x.samples.jsonl"
    path.write_text(samples.encode(0, [1.0]) + '{"row": 1, "us": [2.0, 3')
    assert samples.read(path) == {0: samples.Kept([1.0], [])}
    path.write_text('{"row": 0, "us": [1.0\n' + samples.encode(1, [1.0]))
    with pytest.raises(ReadError, match=r"x.samples.jsonl: line 1 is not a samples line"):
        samples.read(path)


def test_a_missing_samples_file_reads_as_no_samples(tmp_path):
    assert samples.read(tmp_path / "none.samples.jsonl") == {}


def test_path_for_sits_beside_the_csv(tmp_path):
    assert samples.path_for(tmp_path / "p2p_matrix.csv") == tmp_path / "p2p_matrix.samples.jsonl"
