"""The engines: the NumPy float32 reference (reference.py) and the CuPy GPU engine (cuda.py).

Both answer the same calls, so search.py runs on either:

    capacity(max_length, beams) -> (rows, source_tokens)  what the KV pool holds at once (the GPU's is fixed)
    encode(sources) -> encoded                     the encoder, and every decoder layer's cross K/V
    start(encoded, source_rows, max_positions)     a decoder state with one row per sequence (per beam)
    step(encoded, state, tokens, want_logits)      feed one token per row; the logits (tests, prefill)
    step_argmax(encoded, state, tokens)            ... and each row's best next token (greedy)
    step_argmax_ahead(encoded, state, tokens)      (optional) the same without waiting: an object whose
                                                   .device feeds the next step, .fetch() gives the ids and
                                                   .subset(rows) follows a select(); search.py falls back
                                                   to step_argmax where an engine has none
    step_topk(encoded, state, tokens, k)           ... and each row's k best by log-probability (beams)
    fetch_later(array)                             (optional) a device array on its way to the host: .fetch()
    reorder(state, parents)                        beams follow their parents (repeats allowed)
    select(state, rows)                            keep these rows; the others' cache goes back
    join(state, other)                             append other's rows (another encoding's, perhaps, at other
                                                   positions: each row keeps its own, state.t) to state's;
                                                   other is left empty (search.greedy_continuous)
    release(state), release_sources(encoded)       give the pool back
    xp                                             numpy or cupy: where the search keeps its beam arrays
"""
