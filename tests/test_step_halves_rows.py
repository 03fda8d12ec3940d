"""Where the GPU engine's decoder step splits its rows in two halves (numerics.halves_at, which needs no GPU).
tests/gpu/test_step_halves.py checks that the halves give each row the bits of the step in one piece."""

import pytest

from nllbcli.model.engine import numerics
from nllbcli.model.engine.numerics import HALF_ROWS, HALVES_MIN_ROWS, halves_at


def test_a_step_of_fewer_rows_than_the_least_runs_in_one_piece():
    assert [halves_at(b) for b in (1, 64, 256, 512, HALVES_MIN_ROWS - 1)] == [0] * 5
    assert halves_at(HALVES_MIN_ROWS) == HALVES_MIN_ROWS // 2


@pytest.mark.parametrize("b", range(HALVES_MIN_ROWS, 8193, 128))
def test_a_graph_bucket_splits_into_whole_gemm_tiles(b):
    """The buckets past 256 rows are multiples of 128 (cuda.bucket): both halves whole 128-row tiles, as many
    tiles in all as the step in one piece, the first half the larger by a tile where their count is odd."""
    at = halves_at(b)
    assert at % HALF_ROWS == 0 and (b - at) % HALF_ROWS == 0
    assert at - (b - at) in (0, HALF_ROWS) and at - (b - at) == b % (2 * HALF_ROWS)


@pytest.mark.parametrize("b", [1024, 1025, 1100, 1151, 4095, 4097])
def test_any_rows_split_with_the_first_half_in_whole_tiles(b):
    """A step launched without graphs runs its live rows alone: the first half whole tiles, the second the rest."""
    at = halves_at(b)
    assert at % HALF_ROWS == 0 and 0 < b - at <= at < b


def test_the_gpu_tests_split_small_steps(monkeypatch):
    """The GPU tests' setting (a half at every 16 rows from 2 rows on) halves every step past 16 rows."""
    monkeypatch.setattr(numerics, "HALVES_MIN_ROWS", 2)
    monkeypatch.setattr(numerics, "HALF_ROWS", 16)
    assert [halves_at(b) for b in (1, 16, 17, 64, 100, 192)] == [0, 0, 16, 32, 64, 96]
