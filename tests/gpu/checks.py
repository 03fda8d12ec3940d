"""Checks shared by the GPU test modules (imported by name: pytest puts tests/gpu on sys.path)."""

import numpy as np


def teacher_forced_errors(ref, gpu, sources: list[list[int]], rng, low: int, high: int, label: str,
                          tolerance: float) -> None:
    """Six teacher-forced decoder steps of the reference and the GPU engine over the same padded batch (one
    source for row 0, two beams for source 1, three for source 2), random tokens in [low, high) from `rng`,
    a beam reorder after the fourth: the logits within `tolerance` of the largest at every step (each step's
    printed first), the pool free after."""
    rows = np.array([0, 1, 1, 2, 2, 2])
    gpu.capacity(16)
    encoded_r, encoded_g = ref.encode(sources), gpu.encode(sources)
    state_r, state_g = ref.start(encoded_r, rows, 16), gpu.start(encoded_g, rows, 16)
    errors = []
    for step in range(6):
        tokens = np.full(len(rows), 2) if step == 0 else rng.integers(low, high, len(rows))
        want = ref.step(encoded_r, state_r, tokens)
        got = gpu.step(encoded_g, state_g, tokens)
        assert not np.isnan(got).any()
        error = np.abs(got - want).max() / np.abs(want).max()
        print(f"{label} step {step}: largest logit error {error:.2e} of the largest logit")
        errors.append(float(error))
        if step == 3:  # beams follow their parents: row 0 copies row 2's cache, row 2 is dropped
            order = np.array([2, 1, 0, 4, 5, 5])
            ref.reorder(state_r, order)
            gpu.reorder(state_g, order)
    assert max(errors) < tolerance, errors
    gpu.release(state_g)
    gpu.release_sources(encoded_g)
    assert gpu.pool.slots.available == gpu.pool.plan.slots
    assert gpu.pool.cross_runs.available == gpu.pool.plan.cross_rows
