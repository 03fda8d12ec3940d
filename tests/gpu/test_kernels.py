"""Every CUDA kernel against NumPy on fresh random inputs, with the output poisoned before the launch."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from nllbcli.model.engine import kernels  # noqa: E402
from nllbcli.model.engine import numerics  # noqa: E402
from nllbcli.model.engine import reference as ref  # noqa: E402

rng = np.random.default_rng(1234)
BF16 = "bfloat16"


bf16 = ref.bf16_round  # the values as the device will hold them


def to_device_bf16(a: np.ndarray):
    return cp.asarray(a, dtype=cp.float32).astype(BF16)


def poisoned(shape, dtype):
    out = cp.empty(shape, dtype=dtype)
    out.fill(float("nan")) if cp.dtype(dtype).kind == "f" or str(dtype) == BF16 else out.fill(-7)
    return out


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert not np.isnan(got).any()
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize("tile", kernels.available_tiles())
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (37, 1000, 72), (300, 515, 1024), (129, 130, 40), (512, 384, 256)])
@pytest.mark.parametrize("epilogue", ["plain", "bias_relu", "bias_residual_f32"])
def test_gemm_matches_reference(tile, m, n, k, epilogue):
    a = bf16(rng.normal(size=(m, k)).astype(np.float32))
    w = bf16(rng.normal(size=(n, k)).astype(np.float32) / np.sqrt(k))
    bias = rng.normal(size=n).astype(np.float32)
    residual = rng.normal(size=(m, n)).astype(np.float32)
    want = a.astype(np.float64) @ w.T.astype(np.float64)
    kwargs = {}
    if epilogue != "plain":
        want = want + bias
        kwargs["bias"] = cp.asarray(bias)
    if epilogue == "bias_relu":
        want = np.maximum(want, 0)
        kwargs["relu"] = True
    if epilogue == "bias_residual_f32":
        want = want + residual
        kwargs["residual"] = cp.asarray(residual)
    out_dtype = cp.float32 if epilogue.endswith("f32") else BF16
    out = poisoned((m, n), out_dtype)
    kernels.gemm(to_device_bf16(a), to_device_bf16(w), out=out, tile=tile, **kwargs)
    got = cp.asnumpy(out.astype(cp.float32))
    assert rel_err(got, want) < (1e-5 if out_dtype == cp.float32 else 1e-2)


@pytest.mark.parametrize("tile", [t for t in kernels.available_tiles() if not kernels.stores_only(t)])
@pytest.mark.parametrize("m,v,d", [(1, 606, 64), (7, 5000, 96), (130, 2051, 128), (700, 30000, 64)])
def test_logits_argmax_matches_reference(tile, m, v, d):
    h = bf16(rng.normal(size=(m, d)).astype(np.float32))
    w = bf16(rng.normal(size=(v, d)).astype(np.float32))
    logits = h.astype(np.float64) @ w.T.astype(np.float64)
    ids, values = kernels.logits_argmax(to_device_bf16(h), to_device_bf16(w), tile=tile, ids=poisoned((m,), cp.int32),
                                        values=poisoned((m,), cp.float32))
    ids, values = cp.asnumpy(ids), cp.asnumpy(values)
    np.testing.assert_allclose(values, logits.max(axis=1), rtol=1e-5)
    top2 = np.sort(np.partition(logits, -2, axis=1)[:, -2:], axis=1)
    clear = (top2[:, 1] - top2[:, 0]) > 1e-4 * np.abs(top2[:, 1])  # a near-tie may go either way in f32
    assert (ids[clear] == logits.argmax(axis=1)[clear]).all()


@pytest.mark.parametrize("tile", kernels.available_tiles())
@pytest.mark.parametrize("k", [200, 256])  # 256: whole 64-column k-steps, so several a stage (KSTEPS)
def test_gemm_when_each_block_walks_many_tiles(tile, k):
    """Persistent blocks take several tiles each, their stages running on across tiles (the ping-pong tile's
    two consumers taking turns over them): every tile lands where it should, bias and ReLU included."""
    m, n = 9000, 1000
    a = bf16(rng.normal(size=(m, k)).astype(np.float32))
    w = bf16(rng.normal(size=(n, k)).astype(np.float32) / np.sqrt(k))
    bias = rng.normal(size=n).astype(np.float32)
    want = np.maximum(a.astype(np.float32) @ w.T.astype(np.float32) + bias, 0)
    out = poisoned((m, n), cp.float32)
    kernels.gemm(to_device_bf16(a), to_device_bf16(w), bias=cp.asarray(bias), relu=True, out=out, tile=tile)
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-4, atol=1e-4)


def test_every_gemm_tile_gives_the_same_bits():
    """Tiles and pipeline depths change the schedule, never the order of each output's sum."""
    a = to_device_bf16(rng.normal(size=(200, 320)).astype(np.float32))
    w = to_device_bf16(rng.normal(size=(700, 320)).astype(np.float32))
    outs = [cp.asnumpy(kernels.gemm(a, w, out_dtype=cp.float32, tile=tile)) for tile in kernels.available_tiles()]
    for other in outs[1:]:
        np.testing.assert_array_equal(other, outs[0])


@pytest.mark.parametrize("tile", [t for t in kernels.available_tiles() if kernels.GEMM_TILES[t]["kind"] == "sm90"])
@pytest.mark.parametrize("m,n", [(1000, 1000), (70, 264), (4100, 512)])
def test_tma_store_gives_the_bits_of_register_stores(tile, m, n, monkeypatch):
    """bf16 outputs leave through shared memory and the TMA unit (bias and ReLU applied on the way), or straight
    from the registers: the same bits, edges of rows and columns included (the TMA unit clips them)."""
    a = to_device_bf16(rng.normal(size=(m, 256)).astype(np.float32))
    w = to_device_bf16(rng.normal(size=(n, 256)).astype(np.float32) / 16)
    bias = cp.asarray(rng.normal(size=n).astype(np.float32))
    outs = []
    for tma in (False, True):
        monkeypatch.setattr(kernels, "TMA_STORE", tma)
        out = poisoned((m, n), BF16)
        kernels.gemm(a, w, bias=bias, relu=True, out=out, tile=tile)
        outs.append(cp.asnumpy(out.view(cp.uint16)))
    np.testing.assert_array_equal(outs[1], outs[0])
    want = np.maximum(cp.asnumpy((a.astype(cp.float32) @ w.astype(cp.float32).T)) + cp.asnumpy(bias), 0)
    np.testing.assert_allclose(cp.asnumpy(out.astype(cp.float32)), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("tile", kernels.available_tiles())
@pytest.mark.parametrize("m,n", [(1000, 1000), (70, 264), (4100, 512)])
def test_gemm_onto_its_residual_in_place(tile, m, n, monkeypatch):
    """out is residual (the engine's residual stream): the bits of the same sum into a new array, through the
    TMA unit's reduction (Hopper) or from the registers."""
    a = to_device_bf16(rng.normal(size=(m, 256)).astype(np.float32))
    w = to_device_bf16(rng.normal(size=(n, 256)).astype(np.float32) / 16)
    bias = cp.asarray(rng.normal(size=n).astype(np.float32))
    residual = cp.asarray(rng.normal(size=(m, n)).astype(np.float32))
    want = cp.asnumpy(kernels.gemm(a, w, bias=bias, residual=residual, out=poisoned((m, n), cp.float32), tile=tile))
    for tma in (False, True):
        monkeypatch.setattr(kernels, "TMA_STORE", tma)
        stream = residual.copy()
        kernels.gemm(a, w, bias=bias, residual=stream, out=stream, tile=tile)
        np.testing.assert_array_equal(cp.asnumpy(stream), want)
    exact = a.astype(cp.float32) @ w.astype(cp.float32).T + bias + residual
    np.testing.assert_allclose(want, cp.asnumpy(exact), rtol=1e-4, atol=1e-4)


STORE_VARIANTS = [dict(OUT_3D=0, EPI_CHUNKS=1, STMATRIX=0), dict(OUT_3D=1, EPI_CHUNKS=1, STMATRIX=0),
                  dict(OUT_3D=1, EPI_CHUNKS=2, STMATRIX=0), dict(OUT_3D=0, EPI_CHUNKS=2, STMATRIX=1),
                  dict(OUT_3D=1, EPI_CHUNKS=2, STMATRIX=1), dict(OUT_3D=1, EPI_CHUNKS=4, STMATRIX=1, STAGING_DIV=1),
                  dict(OUT_3D=0, EPI_CHUNKS=1, STMATRIX=0, STAGING_ALWAYS=1),
                  dict(OUT_3D=1, EPI_CHUNKS=4, STMATRIX=1, STAGING_ALWAYS=1)]


@pytest.mark.skipif(not kernels.wgmma_available(), reason="the TMA store needs Hopper")
@pytest.mark.parametrize("tile", ["wg256", "wg192", "wg128", "wg64k2"])
@pytest.mark.parametrize("store", STORE_VARIANTS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
@pytest.mark.parametrize("m,n", [(1000, 320), (70, 192), (4100, 512), (300, 1000)])  # n % 64: whole boxes a row
def test_every_tma_store_epilogue_gives_the_same_bits(tile, store, m, n, monkeypatch):
    """The TMA store epilogue's ways (3-D copies of several boxes, copies in chunks, stmatrix, more passes through
    smaller buffers) give the register path's bits, bf16 with bias and ReLU and f32 onto the residual in place,
    edges of rows and columns included."""
    a = to_device_bf16(rng.normal(size=(m, 256)).astype(np.float32))
    w = to_device_bf16(rng.normal(size=(n, 256)).astype(np.float32) / 16)
    bias = cp.asarray(rng.normal(size=n).astype(np.float32))
    residual = cp.asarray(rng.normal(size=(m, n)).astype(np.float32))
    want16, want32 = poisoned((m, n), BF16), residual.copy()
    monkeypatch.setattr(kernels, "TMA_STORE", False)
    kernels.gemm(a, w, bias=bias, relu=True, out=want16, tile=tile)
    kernels.gemm(a, w, bias=bias, residual=want32, out=want32, tile=tile)
    monkeypatch.setattr(kernels, "TMA_STORE", True)
    for key, value in store.items():
        monkeypatch.setitem(kernels.STORE_OPTIONS, key, value)
    out16, out32 = poisoned((m, n), BF16), residual.copy()
    kernels.gemm(a, w, bias=bias, relu=True, out=out16, tile=tile)
    kernels.gemm(a, w, bias=bias, residual=out32, out=out32, tile=tile)
    np.testing.assert_array_equal(cp.asnumpy(out16.view(cp.uint16)), cp.asnumpy(want16.view(cp.uint16)))
    np.testing.assert_array_equal(cp.asnumpy(out32), cp.asnumpy(want32))


def dependent_chain(x, ws, residual, steps: int):
    """GEMMs each reading what the one before wrote: bf16 out of one the next's input, and the f32 residual
    added onto in place (a GEMM started before the last one's writes landed would read stale rows or lose adds)."""
    for i in range(steps):
        h = kernels.gemm(x, ws[i % len(ws)], relu=True)
        kernels.gemm(h, ws[(i + 1) % len(ws)], residual=residual, out=residual)
        x = residual.astype(BF16)
    return residual


@pytest.mark.skipif(not kernels.wgmma_available(), reason="programmatic launches are of the wgmma GEMMs")
@pytest.mark.parametrize("m", [64, 4100])
def test_programmatic_launches_give_the_bits_of_plain_ones(m, monkeypatch):
    """The wgmma GEMMs go out as programmatic dependent launches (launch.py): a chain of GEMMs each reading the
    last one's output, eagerly and as a CUDA graph, gives the bits of CuPy's launches one after the other; and
    the driver took them (launch.py gave nothing up)."""
    from nllbcli.model.engine import launch

    ws = [to_device_bf16(rng.normal(size=(512, 512)).astype(np.float32) / 24) for _ in range(3)]
    x = to_device_bf16(rng.normal(size=(m, 512)).astype(np.float32))
    start = cp.asarray(rng.normal(size=(m, 512)).astype(np.float32))
    monkeypatch.setattr(launch, "ENABLED", False)
    want = cp.asnumpy(dependent_chain(x, ws, start.copy(), 12))
    monkeypatch.setattr(launch, "ENABLED", True)
    assert launch.available(), launch._failed
    got = cp.asnumpy(dependent_chain(x, ws, start.copy(), 12))
    np.testing.assert_array_equal(got, want)
    stream = cp.cuda.Stream(non_blocking=True)
    residual = start.copy()
    x_fixed = x.copy()
    with stream:
        dependent_chain(x_fixed, ws, residual, 1)  # compiled and warm before the capture
        residual[:] = start
        stream.begin_capture()
        dependent_chain(x_fixed, ws, residual, 12)
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(residual), want)
    assert launch._failed is None


def layer_chain(h, ln, ws, steps: int, weights: bool):
    """A decoder layer's FFN as the engine runs it: a LayerNorm (which lets the next GEMM launch under it), the
    GEMM reading its output, the GEMM after reading that one's, adding onto the residual h in place."""
    for i in range(steps):
        x = kernels.layernorm(h, *ln)
        f = kernels.gemm(x, ws[i % 2][0], ws[i % 2][1], relu=True, weights=weights)
        kernels.gemm(f, ws[1 - i % 2][2], ws[1 - i % 2][3], residual=h, out=h, weights=weights)
    return h


@pytest.mark.skipif(not kernels.wgmma_available(), reason="programmatic launches are of the wgmma GEMMs")
@pytest.mark.parametrize("m", [64, 4100])
def test_weights_loaded_before_the_wait_give_the_same_bits(m, monkeypatch):
    """weights=True (the engine's GEMMs): the weights' first stages load before the wait for the kernel before
    (a LayerNorm or a GEMM, which let it launch under them), the activations after: the bits of plain launches,
    eagerly and as a CUDA graph; the activations read early would be the last step's, and differ."""
    from nllbcli.model.engine import launch

    ws = [(to_device_bf16(rng.normal(size=(1024, 256)).astype(np.float32) / 16),
           cp.asarray(rng.normal(size=1024).astype(np.float32)),
           to_device_bf16(rng.normal(size=(256, 1024)).astype(np.float32) / 32),
           cp.asarray(rng.normal(size=256).astype(np.float32))) for _ in range(2)]
    ln = (cp.asarray(rng.normal(size=256).astype(np.float32)), cp.asarray(rng.normal(size=256).astype(np.float32)))
    start = cp.asarray(rng.normal(size=(m, 256)).astype(np.float32))
    cp.cuda.Device().synchronize()  # the weights settled, as the engine's after its load
    monkeypatch.setattr(launch, "ENABLED", False)
    want = cp.asnumpy(layer_chain(start.copy(), ln, ws, 12, weights=False))
    monkeypatch.setattr(launch, "ENABLED", True)
    assert launch.available(), launch._failed
    np.testing.assert_array_equal(cp.asnumpy(layer_chain(start.copy(), ln, ws, 12, weights=True)), want)
    stream = cp.cuda.Stream(non_blocking=True)
    h = start.copy()
    with stream:
        layer_chain(h, ln, ws, 1, weights=True)  # compiled and warm before the capture
        h[:] = start
        stream.begin_capture()
        layer_chain(h, ln, ws, 12, weights=True)
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(h), want)
    assert launch._failed is None


def test_logits_argmax_breaks_ties_towards_the_lower_id():
    h = to_device_bf16(np.ones((3, 16), np.float32))
    w = np.zeros((300, 16), np.float32)
    w[[17, 140, 290]] = 1.0  # three equal maxima, in different column blocks
    ids, _ = kernels.logits_argmax(h, to_device_bf16(w))
    assert cp.asnumpy(ids).tolist() == [17, 17, 17]


# (the first pass's tile gives statistics per 128 columns on Hopper, 64 elsewhere: its width a multiple of that)
@pytest.mark.parametrize("tile", [t for t in kernels.available_tiles() if t != "large" and not kernels.stores_only(t) and (
    kernels.GEMM_TILES[t]["kind"] == "mma" or kernels.GEMM_TILES[t]["BN"] % 128 == 0)])
@pytest.mark.parametrize("k", [1, 8, 32])
@pytest.mark.parametrize("m,v,d", [(1, 606, 64), (70, 5000, 96), (9, 3208, 256), (200, 3000, 64)])
def test_logits_topk_matches_reference(tile, k, m, v, d):
    h = bf16(rng.normal(size=(m, d)).astype(np.float32))
    w = bf16(rng.normal(size=(v, d)).astype(np.float32) / 4)
    logits = h.astype(np.float64) @ w.T.astype(np.float64)
    logprob = logits - logits.max(1, keepdims=True)
    logprob -= np.log(np.exp(logprob).sum(1, keepdims=True))
    got_lp, got_ids = kernels.logits_topk(to_device_bf16(h), to_device_bf16(w), k, logprob=poisoned((m, k), cp.float32),
                                          ids=poisoned((m, k), cp.int32), tile=tile)
    got_lp, got_ids = cp.asnumpy(got_lp), cp.asnumpy(got_ids)
    want_ids = np.argsort(-logprob, axis=1, kind="stable")[:, :k]
    want_lp = np.take_along_axis(logprob, want_ids, axis=1)
    np.testing.assert_allclose(got_lp, want_lp, rtol=1e-4, atol=1e-4)
    assert (np.diff(got_lp, axis=1) <= 0).all()
    ranked = np.sort(logprob, axis=1)[:, ::-1][:, : k + 1]
    clear = (ranked[:, :-1] - ranked[:, 1:]) > 1e-4  # rank i's gap to rank i + 1: more than float32 sums can swap
    clear[:, 1:] &= clear[:, :-1]  # and its gap to rank i - 1: a near tie above may swap into this place
    wrong = np.argwhere(clear & (got_ids != want_ids))
    assert not len(wrong), f"{len(wrong)} ids out of place, first (row, rank): {wrong[:5].tolist()}"


def test_logits_topk_breaks_ties_towards_the_lower_id():
    h = to_device_bf16(np.ones((2, 16), np.float32))
    w = np.zeros((300, 16), np.float32)
    w[[290, 17, 140, 5]] = [[1.0] * 16, [1.0] * 16, [1.0] * 16, [0.5] * 16]
    lp, ids = kernels.logits_topk(h, to_device_bf16(w), 4)
    assert cp.asnumpy(ids).tolist() == [[17, 140, 290, 5]] * 2


def rows_topk_wanted(x: np.ndarray, lse: np.ndarray, k: int):
    """numerics.topk_desc of x - lse in float32, as the host computes it: ties to the lower id."""
    return numerics.topk_desc((x - lse[:, None]).astype(np.float32), k)


@pytest.mark.parametrize("k", [1, 33, 40, 64, 300, 1000, kernels.ROWS_TOPK_MAX])
@pytest.mark.parametrize("m,v,grid", [(3, 1000, 0), (5, 3208, 0), (4, 5000, 1 / 64), (2, 256206, 0), (3, 256206, 1 / 8)])
def test_rows_topk_is_a_stable_sort_of_the_log_probs(k, m, v, grid):
    """The k best of each row's log-probabilities, best first, ties to the lower id, with the row's log-sum-exp:
    rows of distinct logits, and of logits on a coarse grid (`grid`), where many are equal at the k-th place."""
    if k > v:
        pytest.skip("k past the vocabulary")
    x = rng.normal(size=(m, v)).astype(np.float32) * 3
    if grid:
        x = (np.round(x / (grid * 64)) * grid * 64).astype(np.float32)
    x[0, : min(v, 2 * k)] = x[0, 0]  # a row whose first 2k are equal: which of them is taken decides the ties
    lse, values, ids = kernels.rows_topk(cp.asarray(x), k, poisoned((m,), cp.float32), poisoned((m, k), cp.float32),
                                         poisoned((m, k), cp.int32))
    lse, values, ids = cp.asnumpy(lse), cp.asnumpy(values), cp.asnumpy(ids)
    want_lse = np.log(np.exp(x.astype(np.float64) - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-4)
    want_values, want_ids = rows_topk_wanted(x, lse, k)
    assert (ids == want_ids).all(), np.argwhere(ids != want_ids)[:5].tolist()
    assert (values == want_values).all()


def test_rows_topk_keeps_its_rows_apart_and_checks_k():
    x = rng.normal(size=(300, 4000)).astype(np.float32)
    lse, values, ids = kernels.rows_topk(cp.asarray(x), 50)
    alone = kernels.rows_topk(cp.asarray(x[123:124]), 50)
    assert (cp.asnumpy(alone[2])[0] == cp.asnumpy(ids)[123]).all()
    with pytest.raises(ValueError, match="rows_topk needs"):
        kernels.rows_topk(cp.asarray(x), kernels.ROWS_TOPK_MAX + 1)


@pytest.mark.parametrize("tile,select_tile", [("small", "small")] + (
    [("wg128", "wg128"), ("wg128", "wg64"), ("wg256", "wg128"), ("wg256", "wg64")]
    if kernels.wgmma_available() else []))
def test_logits_topk_is_the_topk_over_every_column(tile, select_tile):
    """The two passes skip most tiles; what they pick is exactly the top-k of the whole row of logits (the
    GEMM's own f32 logits, the same bits), in order, with one log-sum-exp per row."""
    m, v, d, k = 300, 20000, 128, 8
    h = to_device_bf16(rng.normal(size=(m, d)).astype(np.float32))
    w = to_device_bf16(rng.normal(size=(v, d)).astype(np.float32) / 4)
    logits = cp.asnumpy(kernels.gemm(h, w, out_dtype=cp.float32, tile=tile))
    lp, ids = kernels.logits_topk(h, w, k, tile=tile, select_tile=select_tile)
    lp, ids = cp.asnumpy(lp), cp.asnumpy(ids)
    order = np.lexsort((np.broadcast_to(np.arange(v), logits.shape), -logits), axis=1)[:, :k]  # ties: lower id
    np.testing.assert_array_equal(ids, order)
    lse = np.take_along_axis(logits, ids, axis=1) - lp  # the same for a row's k entries, up to rounding
    np.testing.assert_allclose(lse, lse[:, :1].repeat(k, axis=1), rtol=1e-6)
    want_lse = np.log(np.exp(logits.astype(np.float64) - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    np.testing.assert_allclose(lse[:, 0], want_lse, rtol=1e-5)
    again_lp, again_ids = kernels.logits_topk(h, w, k)  # the default tiles
    np.testing.assert_array_equal(cp.asnumpy(again_ids), ids)
    if kernels.GEMM_TILES[select_tile]["BN"] == (128 if kernels.wgmma_available() else 64):
        np.testing.assert_array_equal(cp.asnumpy(again_lp), lp)  # statistics over parts of the same width: same bits


def test_logits_topk_when_every_block_ties():
    """All logits equal: every block's max reaches the threshold, so nothing is skipped; ties go to the lower id."""
    h = to_device_bf16(rng.normal(size=(5, 64)).astype(np.float32))
    lp, ids = kernels.logits_topk(h, to_device_bf16(np.zeros((3000, 64), np.float32)), 8)
    assert cp.asnumpy(ids).tolist() == [list(range(8))] * 5
    np.testing.assert_allclose(cp.asnumpy(lp), -np.log(3000), rtol=1e-5)


@pytest.mark.parametrize("m,d", [(1, 64), (33, 1024), (5, 48), (9, 2048), (3, 2052), (2, 1028)])
def test_layernorm_matches_reference(m, d):
    x = rng.normal(2.0, 3.0, size=(m, d)).astype(np.float32)
    w, b = rng.normal(1, 0.3, d).astype(np.float32), rng.normal(0, 0.3, d).astype(np.float32)
    out = poisoned((m, d), BF16)
    kernels.layernorm(cp.asarray(x), cp.asarray(w), cp.asarray(b), out=out)
    want = ref.layernorm(x.astype(np.float64), w, b)
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), want) < 1e-2


def test_embed_matches_reference():
    v, d, p = 500, 64, 70
    table = bf16(rng.normal(size=(v, d)).astype(np.float32))
    positions = numerics.sinusoidal_positions(p, d, 1)
    ids = rng.integers(0, v, 40).astype(np.int32)
    pos = rng.integers(1, p, 40).astype(np.int32)
    out = poisoned((40, d), cp.float32)
    kernels.embed(cp.asarray(ids), cp.asarray(pos), to_device_bf16(table), cp.asarray(positions), 8.0, out=out)
    np.testing.assert_allclose(cp.asnumpy(out), ref.embed(ids, pos, table, 8.0, positions), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("max_keys", [None, 64])  # None: the general kernel; 64: the warp-per-row one for E 64, 128
@pytest.mark.parametrize("heads,d", [(16, 1024), (2, 48), (8, 64), (4, 64), (4, 256), (8, 1024)])
def test_attention_matches_reference(heads, d, max_keys):
    """Queries over runs of key rows, reading q, k and v as column slices of one fused QKV array."""
    rows, keys = 9, 60
    qkv = bf16(rng.normal(size=(keys, 3 * d)).astype(np.float32))
    device_qkv = to_device_bf16(qkv)
    start = rng.integers(0, keys // 2, rows).astype(np.int32)
    length = np.array([rng.integers(1, keys - s + 1) for s in start], dtype=np.int32)
    out = poisoned((rows, d), BF16)
    kernels.attention(device_qkv[:rows, :d], device_qkv[:, d : 2 * d], device_qkv[:, 2 * d :], cp.asarray(start),
                      cp.asarray(length), heads, out=out, max_keys=max_keys)
    q, k, v = qkv[:rows, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]
    want = np.stack([
        ref.attention(q[r][None, None].astype(np.float64), k[s : s + n][None].astype(np.float64),
                      v[s : s + n][None].astype(np.float64), None, heads)[0, 0]
        for r, (s, n) in enumerate(zip(start, length))
    ])
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), want) < 1e-2


@pytest.mark.parametrize("rows", [4, 9, 13])  # whole blocks of 4 rows, and a last block part-filled
@pytest.mark.parametrize("heads,d", [(16, 1024), (4, 256), (8, 1024)])
def test_attention_of_rows_together_is_the_same_bits(heads, d, rows):
    """together (a block: one head of 4 rows, as a sentence's beams read one source) changes which warps run
    together, not what any computes: the same bits as the default mapping, where runs are shared and where not."""
    keys = 200
    qkv = to_device_bf16(bf16(rng.normal(size=(keys, 3 * d)).astype(np.float32)))
    q, k, v = qkv[:rows, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]
    for start in (np.repeat(rng.integers(0, 100, -(-rows // 4)), 4)[:rows], rng.integers(0, 100, rows)):
        start = cp.asarray(start.astype(np.int32))
        length = cp.asarray(rng.integers(1, 100, rows).astype(np.int32))
        apart, together = poisoned((rows, d), BF16), poisoned((rows, d), BF16)
        kernels.attention(q, k, v, start, length, heads, out=apart, max_keys=100)
        kernels.attention(q, k, v, start, length, heads, out=together, max_keys=100, together=True)
        assert (apart.view(cp.uint16) == together.view(cp.uint16)).all()


@pytest.mark.parametrize("t", [9, 300])  # the decode kernel takes keys 32 at a time: one run, and several
@pytest.mark.parametrize("heads,d", [(4, 64), (4, 256), (8, 1024)])
def test_attention_reads_keys_through_a_row_table(heads, d, t):
    """Decoder self-attention: each query's keys are the cache rows its table lists, in table order."""
    rows, pool_rows = 6, 400
    k = bf16(rng.normal(size=(pool_rows, d)).astype(np.float32))
    v = bf16(rng.normal(size=(pool_rows, d)).astype(np.float32))
    q = bf16(rng.normal(size=(rows, d)).astype(np.float32))
    table = rng.integers(0, pool_rows, (rows, t)).astype(np.int32)
    length = rng.integers(1, t + 1, rows).astype(np.int32)
    out = poisoned((rows, d), BF16)
    kernels.attention(to_device_bf16(q), to_device_bf16(k), to_device_bf16(v), None, cp.asarray(length), heads, out=out,
                      table=cp.asarray(table), max_keys=t)
    want = np.stack([
        ref.attention(q[r][None, None].astype(np.float64), k[table[r, :n]][None].astype(np.float64),
                      v[table[r, :n]][None].astype(np.float64), None, heads)[0, 0]
        for r, n in enumerate(length)
    ])
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), want) < 1e-2


PREFILL_LENGTHS = [1, 2, 17, 33, 64, 200, 256]


def prefill_both_ways(qkv: np.ndarray, d: int, lengths: list[int], heads: int, room: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """kernels.attention_prefill over `lengths` padded to max(lengths) rows each (qkv: those rows, a fused QKV),
    then packed one after another with max_len `room` past the longest; both outputs poisoned first. -> padded
    (B S, D), packed (sum of lengths, D) as float32."""
    s, b = max(lengths), len(lengths)
    device_qkv = to_device_bf16(qkv)
    out = poisoned((b * s, d), BF16)
    kernels.attention_prefill(device_qkv[:, :d], device_qkv[:, d : 2 * d], device_qkv[:, 2 * d :],
                              cp.asarray(np.arange(b, dtype=np.int32) * s), cp.asarray(np.array(lengths, np.int32)), s, s,
                              heads, out=out)
    padded = cp.asnumpy(out.astype(cp.float32))
    packed_qkv = to_device_bf16(np.concatenate([qkv[i * s : i * s + n] for i, n in enumerate(lengths)]))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    out = poisoned((sum(lengths), d), BF16)
    kernels.attention_prefill(packed_qkv[:, :d], packed_qkv[:, d : 2 * d], packed_qkv[:, 2 * d :], cp.asarray(starts),
                              cp.asarray(np.array(lengths, np.int32)), 0, s + room, heads, out=out)
    return padded, cp.asnumpy(out.astype(cp.float32))


@pytest.mark.parametrize("heads,d,lengths", [(16, 1024, [60, 3, 17]), (2, 48, [5, 1]), (4, 256, [300, 40]), (16, 1024, [900])])
def test_attention_prefill_matches_reference(heads, d, lengths):
    """Encoder self-attention over padded sequences (a fused QKV), and packed (no padding rows, max_len the longest):
    the same bits; 900 tokens of head size 64 do not fit in shared memory and take the fallback."""
    s = max(lengths)
    qkv = bf16(rng.normal(size=(len(lengths) * s, 3 * d)).astype(np.float32))
    got, packed = prefill_both_ways(qkv, d, lengths, heads, room=0)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for i, (start, n) in enumerate(zip(starts, lengths)):
        rows = qkv[i * s : i * s + n]
        want = ref.attention(rows[None, :, :d].astype(np.float64), rows[None, :, d : 2 * d].astype(np.float64),
                             rows[None, :, 2 * d :].astype(np.float64), None, heads)[0]
        assert rel_err(got[i * s : i * s + n], want) < 1e-2
        np.testing.assert_array_equal(packed[start : start + n], got[i * s : i * s + n])


@pytest.mark.parametrize("e", [64, 128])
def test_attention_prefill_mma_matches_reference(e, monkeypatch):
    """The tensor-core prefill (attention_prefill_mma_*) against float64 attention, and against the CUDA-core
    kernel (attention_prefill_64/128), padded and packed, lengths 1 .. 256 (one to four 64-key chunks), flat
    scores and sharp ones (queries 4x).
    Bound: each output within its bf16 rounding (2^-8 of itself) plus the error of P's weights, u max|v - out|
    <= 2 u max|v| for weights within u of themselves (reference.attention_prefill_mma: u = 2^-16 for P as
    bf16 hi + lo, which the CPU test checks at 2^-15 max|v|); 2^-12 max|v| here leaves u = 2^-13 for the device's
    own errors: __expf (about 2^-21 of P), f32 scores summed in the tensor cores' order.
    Against the CUDA-core kernel: both are bf16 roundings of nearly the same f32 value, so at most a bf16 step
    apart and mostly equal (the NumPy model differs from the exact rounding in 0.1-0.2% of elements; P as bf16
    alone, 17-39%)."""
    heads = 1024 // e
    d = heads * e
    s = max(PREFILL_LENGTHS)
    assert kernels.prefill_mma_smem(e, s + 40) <= kernels.PREFILL_SMEM_LIMIT  # both launches take the tensor cores
    for sharpness in (1.0, 4.0):
        qkv = rng.normal(size=(len(PREFILL_LENGTHS) * s, 3 * d)).astype(np.float32)
        qkv[:, :d] *= sharpness
        qkv = bf16(qkv)
        monkeypatch.setattr(kernels, "PREFILL_MMA", True)
        padded, packed = prefill_both_ways(qkv, d, PREFILL_LENGTHS, heads)
        monkeypatch.setattr(kernels, "PREFILL_MMA", False)
        old_padded, old_packed = prefill_both_ways(qkv, d, PREFILL_LENGTHS, heads)
        starts = np.concatenate([[0], np.cumsum(PREFILL_LENGTHS)[:-1]])
        for i, (start, n) in enumerate(zip(starts, PREFILL_LENGTHS)):
            rows = qkv[i * s : i * s + n]
            want = ref.attention(rows[None, :, :d].astype(np.float64), rows[None, :, d : 2 * d].astype(np.float64),
                                 rows[None, :, 2 * d :].astype(np.float64), None, heads)[0]
            got = padded[i * s : i * s + n]
            assert not np.isnan(got).any()
            vmax = np.abs(rows[:, 2 * d :]).reshape(n, heads, e).max(axis=(0, 2)).repeat(e)  # max|v| of each column's head
            assert (np.abs(got - want) <= 2.0**-8 * np.abs(want) + 2.0**-12 * vmax).all(), (n, np.abs(got - want).max())
            np.testing.assert_array_equal(padded[i * s + n : (i + 1) * s], 0)  # padding rows written as zeros
            np.testing.assert_array_equal(packed[start : start + n], got)  # packed or padded: the same bits
            old = old_padded[i * s : i * s + n]
            np.testing.assert_array_equal(old_packed[start : start + n], old)
            assert (np.abs(got - old) <= 2.0**-7 * np.abs(old) + 2.0**-12 * vmax).all()
            assert (got != old).mean() <= 0.05, (n, (got != old).mean())


def test_copy_rows_places_rows():
    pool = cp.zeros((24, 16), dtype=BF16)
    src = bf16(rng.normal(size=(3, 48)).astype(np.float32))
    device_src = to_device_bf16(src)
    kernels.copy_rows(device_src[:, 16:32], cp.asarray([0, 1, 2], dtype=cp.int32), pool, cp.asarray([17, 0, 3], dtype=cp.int32))
    want = np.zeros((24, 16), np.float32)
    want[17], want[0], want[3] = src[:, 16:32]
    np.testing.assert_array_equal(cp.asnumpy(pool.astype(cp.float32)), want)


def test_step_prep_does_a_steps_bookkeeping():
    n, cache_rows, pad = 300, 9, 1
    tokens = rng.integers(0, 50, n).astype(np.int32)
    tokens[::7] = pad
    row_t = rng.integers(0, cache_rows + 3, n).astype(np.int32)  # past the end: padding rows, clamped
    slot_base = (rng.permutation(n) * cache_rows).astype(np.int32)
    table = rng.integers(0, 1000, (n, cache_rows)).astype(np.int32)
    d_row_t, d_table = cp.asarray(row_t), cp.asarray(table)
    pos, new_rows, self_len = (poisoned((n,), cp.int32) for _ in range(3))
    kernels.step_prep(cp.asarray(tokens), d_row_t, cp.asarray(slot_base), d_table, pos, new_rows, self_len, pad)
    t = np.minimum(row_t, cache_rows - 1)
    want_table = table.copy()
    want_table[np.arange(n), t] = slot_base + t
    assert (pos.get() == np.where(tokens == pad, pad, t + pad + 1)).all()
    assert (new_rows.get() == slot_base + t).all()
    assert (self_len.get() == t + 1).all() and (d_row_t.get() == t + 1).all()
    assert (d_table.get() == want_table).all()


# the engine's argmax tiles: wgmma's two, mma.sync's two (kernels.logits_argmax, kernels.gemm_tile)
ARGMAX_TILES = ["small", "large"] + (["wg64w", "wg256"] if kernels.wgmma_available() else [])


@pytest.mark.parametrize("tile", ARGMAX_TILES)
@pytest.mark.parametrize("m,v,d", [(1, 606, 64), (7, 5000, 96), (130, 2051, 128), (300, 30001, 64)])
def test_logits_argmax_log_probs_match_reference(tile, m, v, d):
    """The ARGMAX_LSE epilogue: the plain argmax's ids and values, bit for bit, and each id's log_softmax."""
    h = to_device_bf16(rng.normal(size=(m, d)).astype(np.float32) * 0.5)
    w = to_device_bf16(rng.normal(size=(v, d)).astype(np.float32) * 0.5)
    logits = cp.asnumpy(kernels.gemm(h, w, out_dtype=cp.float32, tile="small")).astype(np.float64)  # the GEMM's bits
    plain_ids, plain_values = kernels.logits_argmax(h, w, tile=tile)
    ids, values = kernels.logits_argmax(h, w, tile=tile, ids=poisoned((m,), cp.int32), values=poisoned((m,), cp.float32),
                                        logprob=(logprob := poisoned((m,), cp.float32)))
    ids, values, logprob = cp.asnumpy(ids), cp.asnumpy(values), cp.asnumpy(logprob)
    np.testing.assert_array_equal(ids, cp.asnumpy(plain_ids))
    np.testing.assert_array_equal(values, cp.asnumpy(plain_values))
    np.testing.assert_array_equal(ids, np.lexsort((np.broadcast_to(np.arange(v), logits.shape), -logits), axis=1)[:, 0])
    top = logits.max(axis=1, keepdims=True)
    want = (logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))[np.arange(m), ids]
    assert not np.isnan(logprob).any()
    np.testing.assert_allclose(logprob, want, rtol=1e-4, atol=1e-4)


def test_logits_argmax_log_probs_of_equal_logits():
    """Every logit equal: the lowest id, each with log-probability -log(V)."""
    h = to_device_bf16(rng.normal(size=(5, 64)).astype(np.float32))
    for tile in ARGMAX_TILES:
        ids, _ = kernels.logits_argmax(h, to_device_bf16(np.zeros((3000, 64), np.float32)), tile=tile,
                                       logprob=(logprob := poisoned((5,), cp.float32)))
        assert cp.asnumpy(ids).tolist() == [0] * 5
        np.testing.assert_allclose(cp.asnumpy(logprob), -np.log(3000), rtol=1e-5)


@pytest.mark.parametrize("tile", [t for t in kernels.available_tiles() if not kernels.stores_only(t)])
@pytest.mark.parametrize("temperature,banned", [(1.0, None), (0.7, 5), (1.6, None)])
def test_logits_argmax_samples_as_the_reference(tile, temperature, banned):
    """The SAMPLE epilogue: argmax of logits / temperature + numerics.gumbel_noise, the banned column left out,
    as the reference engine draws; its value is the perturbed logit."""
    from nllbcli.model.engine.numerics import gumbel_noise, inverse_temperature, step_keys

    m, v, d = 70, 5000, 64
    h = bf16(rng.normal(size=(m, d)).astype(np.float32) * 0.3)
    w = bf16(rng.normal(size=(v, d)).astype(np.float32) * 0.3)
    logits = (h.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)
    keys = step_keys(rng.integers(0, 2**32, m, dtype=np.uint64).astype(np.uint32), 7)
    z = logits * inverse_temperature(temperature) + gumbel_noise(keys, np.broadcast_to(np.arange(v), (m, v)))
    if banned is not None:
        z[:, banned] = -np.inf
    ids, values = kernels.logits_argmax(to_device_bf16(h), to_device_bf16(w), tile=tile, ids=poisoned((m,), cp.int32),
                                        values=poisoned((m,), cp.float32), noise=cp.asarray(keys),
                                        temperature=temperature, banned=banned)
    ids, values = cp.asnumpy(ids), cp.asnumpy(values)
    top2 = np.sort(np.partition(z, -2, axis=1)[:, -2:], axis=1)
    clear = (top2[:, 1] - top2[:, 0]) > 1e-4 * np.abs(top2[:, 1])
    assert clear.mean() > 0.9 and (ids[clear] == z.argmax(axis=1)[clear]).all()
    np.testing.assert_allclose(values, z.max(axis=1), rtol=1e-4, atol=1e-3)  # the GPU's fast log
    assert banned is None or not (ids == banned).any()


def test_sample_keys_match_reference():
    """step.cu's sample_keys_kernel: numerics.step_keys of each row's key at its step (self_len - 2)."""
    from nllbcli.model.engine.numerics import step_keys

    n = 1000
    keys = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    self_len = rng.integers(2, 300, n).astype(np.int32)
    noise = cp.full((n,), 7, dtype=cp.uint32)
    kernels.sample_keys(cp.asarray(keys), cp.asarray(self_len), noise)
    assert (cp.asnumpy(noise) == step_keys(keys, self_len - 2)).all()


def test_logits_lse_matches_reference():
    m, v, d = 37, 3208, 256
    h = bf16(rng.normal(size=(m, d)).astype(np.float32) * 0.2)
    w = bf16(rng.normal(size=(v, d)).astype(np.float32) * 0.2)
    logits = h.astype(np.float64) @ w.T.astype(np.float64)
    top = logits.max(axis=1)
    want = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    got = cp.asnumpy(kernels.logits_lse(to_device_bf16(h), to_device_bf16(w)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
