"""Where the GPU engine's decoder step splits its rows in two halves (numerics.halves_at), and the order a staggered
step issues its halves' phases in (numerics.step_phases, staggered_order): neither needs a GPU.
tests/gpu/test_step_halves.py checks that the halves give each row the bits of the step in one piece."""

import pytest

from nllbcli.model.engine import numerics
from nllbcli.model.engine.numerics import (ATTENTION, GEMM, HALF_ROWS, HALVES_MIN_ROWS, HEAD, Issue, halves_at,
                                           staggered_order, step_phases)


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


def test_a_step_alternates_products_and_attention():
    """A layer's two attentions, each between two runs of products; the output projection last, after the last
    layer's feed-forward products."""
    assert step_phases(1) == [GEMM, ATTENTION, GEMM, ATTENTION, GEMM, HEAD]
    phases = step_phases(12)
    assert len(phases) == 4 * 12 + 2 and phases.count(ATTENTION) == 2 * 12
    assert all((a == ATTENTION) != (b == ATTENTION) for a, b in zip(phases, phases[1:-1]))


def test_a_staggered_step_of_one_layer():
    """The second half a phase behind the first: its products beside the first half's attention, and back; the
    first turn, the second half's last before the output projections, and those alone on the GPU (every SM)."""
    assert staggered_order(step_phases(1)) == [
        Issue(0, 0, 0, False), Issue(1, 0, 1, True),
        Issue(0, 1, None, False), Issue(0, 2, 2, True), Issue(1, 1, None, False), Issue(1, 2, 3, True),
        Issue(0, 3, None, False), Issue(0, 4, 4, True), Issue(1, 3, None, False), Issue(1, 4, 5, False),
        Issue(0, 5, 6, False), Issue(1, 5, 7, False)]


@pytest.mark.parametrize("phases", [step_phases(layers) for layers in (1, 2, 12, 24)]
                         + [[ATTENTION, GEMM, ATTENTION], [GEMM, GEMM, ATTENTION, HEAD], [ATTENTION], []],
                         ids=["1 layer", "2 layers", "12 layers", "24 layers", "attention first and last",
                              "products back to back", "no products", "none"])
def test_each_half_issues_its_phases_in_order_and_the_turns_alternate(phases):
    order = staggered_order(phases)
    for half in (0, 1):  # every phase of each half once, in order
        assert [i.phase for i in order if i.half == half] == list(range(len(phases)))
    turns = [i for i in order if i.turn is not None]
    # a products phase is a turn, an attention none; turn t is issued after turn t - 1, the one it waits for
    assert all((i.turn is None) == (phases[i.phase] == ATTENTION) for i in order)
    assert [i.turn for i in turns] == list(range(len(turns)))
    assert [i.half for i in turns] == [t % 2 for t in range(len(turns))]
    for i in turns:  # beside: the other half has an attention issued between its turns just before and after
        other = [j for j in order if j.half != i.half]
        before = next((n for n, j in enumerate(other) if j.turn == i.turn - 1), -1)
        after = next((n for n, j in enumerate(other) if j.turn == i.turn + 1), len(other))
        assert i.beside == any(j.turn is None for j in other[before + 1 : after]), i
