"""Greedy and beam search with the semantics of transformers' `generate`.

The decoder starts from `[decoder_start, tgt_lang]`: the language token is forced, never chosen, and counts
as the first of at most `max_length` generated tokens (transformers' `max_new_tokens`). Beam search follows
transformers' vectorised beam search with `early_stopping=False` operation for operation: 2K candidates per
sentence, finished hypotheses scored `sum(log p) / length ** length_penalty` (length counts the generated
tokens, the language token included), and the same stop heuristic. Sentences are independent: one that is
done (its finished beams can no longer change) leaves the batch, which changes nothing for the others.

The search talks to the engine through a few calls (encode, start, step_argmax or step_topk, select), so it
does not know whether the engine runs on NumPy or CuPy. Beam search needs only each beam's 2K best next
tokens: the 2K best continuations of a sentence over all its beams are among them, because a beam's score is
added to every token of that beam alike. So the engine can choose them where the logits are made.
"""

from __future__ import annotations

import numpy as np

from .checkpoint import ModelConfig
from .options import DecodeOptions

NEG = np.float32(-1.0e9)  # transformers' "very large negative" for masked beams


def generate(engine, sources: list[list[int]], tgt_lang_id: int, config: ModelConfig, options: DecodeOptions) -> list[list[int]]:
    """Token ids of each translation, after the language token and without </s>, in the order of `sources`."""
    if not sources:
        return []
    encoded = engine.encode(sources)
    search = greedy_search if options.beam_size == 1 else beam_search
    try:
        return search(engine, encoded, len(sources), tgt_lang_id, config, options)
    finally:
        engine.release_sources(encoded)


def strip_output(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def greedy_search(engine, encoded, batch: int, tgt_lang_id: int, config: ModelConfig, options: DecodeOptions) -> list[list[int]]:
    eos = config.eos_token_id
    state = engine.start(encoded, np.arange(batch), options.max_length + 1)
    engine.step(encoded, state, np.full(batch, config.decoder_start_token_id), want_logits=False)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    alive = np.arange(batch)  # which sentence each decoder row belongs to
    tokens = np.full(batch, tgt_lang_id)
    for _ in range(options.max_length - 1):  # the language token was the first generated token
        tokens = np.asarray(engine.step_argmax(encoded, state, tokens))  # (N,) first maximum on ties, as torch.argmax
        keep = []
        for row, (sentence, token) in enumerate(zip(alive, tokens)):
            outputs[sentence].append(int(token))
            if token != eos:
                keep.append(row)
        if len(keep) < len(alive):
            if not keep:
                break
            engine.select(state, np.array(keep))
            alive, tokens = alive[keep], tokens[keep]
    engine.release(state)
    return [strip_output(o, eos) for o in outputs]


def topk_desc(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values along the last axis of a 2-D array, sorted descending (ties: lower index first),
    and their indices. Partition first: a full sort of beams x 256k candidates per step would dominate."""
    if x.shape[-1] <= 4 * k:
        order = np.argsort(-x, axis=-1, kind="stable")[:, :k]
        return np.take_along_axis(x, order, axis=-1), order
    order = np.empty((x.shape[0], k), dtype=np.int64)
    for r, row in enumerate(x):
        kth = np.partition(row, row.size - k)[row.size - k]  # the k-th largest value
        above = np.flatnonzero(row > kth)
        picked = np.concatenate([above, np.flatnonzero(row == kth)[: k - above.size]])
        order[r] = picked[np.lexsort((picked, -row[picked]))]
    return np.take_along_axis(x, order, axis=-1), order


def beam_search(engine, encoded, batch: int, tgt_lang_id: int, config: ModelConfig, options: DecodeOptions) -> list[list[int]]:
    k, eos = options.beam_size, config.eos_token_id
    lp = options.length_penalty
    max_len = options.max_length + 1  # transformers' max_length: the decoder start plus max_new_tokens
    keep = 2 * k  # candidates kept per sentence: (one EOS token + 1) * beams, so K stay open when K end
    # Per active sentence (axis 0). The search starts after the forced language token, whose log-prob is 0
    # (transformers' forced-BOS processor), with beam 0 live and the others at -1e9, as after its first step.
    run_seq = np.full((batch, k, max_len), config.pad_token_id, dtype=np.int64)
    run_seq[:, :, 0] = config.decoder_start_token_id
    run_seq[:, :, 1] = tgt_lang_id
    run_score = np.full((batch, k), NEG, dtype=np.float32)
    run_score[:, 0] = 0
    fin_seq = run_seq.copy()
    fin_score = np.full((batch, k), NEG, dtype=np.float32)
    fin_done = np.zeros((batch, k), dtype=bool)
    sentences = np.arange(batch)  # which input sentence each active sentence is
    results: dict[int, list[int]] = {}

    state = engine.start(encoded, np.repeat(np.arange(batch), k), max_len)
    engine.step(encoded, state, np.full(batch * k, config.decoder_start_token_id), want_logits=False)
    tokens = np.full(batch * k, tgt_lang_id)
    cur_len = 2
    if max_len <= cur_len:  # max_length 1: the language token alone
        engine.release(state)
        return [[] for _ in range(batch)]
    while True:
        n = len(sentences)
        row_lp, row_ids = engine.step_topk(encoded, state, tokens, keep)  # (n*K, 2K) each, best first
        row_lp, row_ids = np.asarray(row_lp, dtype=np.float32), np.asarray(row_ids)
        # candidates ordered as transformers' top-k over beam * V + token: by score, then beam, then token
        scores = row_lp.reshape(n, k, keep) + run_score[:, :, None]
        top_score, top_index = topk_desc(scores.reshape(n, k * keep), keep)  # (n, 2K)
        top_beam = top_index // keep
        top_token = np.take_along_axis(row_ids.reshape(n, k * keep), top_index, axis=1)
        top_seq = np.take_along_axis(run_seq, top_beam[:, :, None], axis=1)  # (n, 2K, L)
        top_seq[:, :, cur_len] = top_token
        hits = (top_token == eos) | (cur_len + 1 >= max_len)  # (n, 2K): ended, or out of room

        # the K best candidates that go on
        open_score = top_score + hits.astype(np.float32) * NEG
        _, next_idx = topk_desc(open_score, k)
        run_seq = np.take_along_axis(top_seq, next_idx[:, :, None], axis=1)
        run_score = np.take_along_axis(open_score, next_idx, axis=1)
        parents = np.take_along_axis(top_beam, next_idx, axis=1)  # (n, K)

        # finished hypotheses: only among the first K candidates, scored with the length penalty
        just_done = hits.copy()
        just_done[:, k:] = False
        normed = top_score / np.float32(float(cur_len + 1 - 1) ** lp)
        normed = normed + (~just_done).astype(np.float32) * NEG
        merged_score = np.concatenate([fin_score, normed], axis=1)
        merged_seq = np.concatenate([fin_seq, top_seq], axis=1)
        merged_done = np.concatenate([fin_done, just_done], axis=1)
        fin_score, best = topk_desc(merged_score, k)
        fin_seq = np.take_along_axis(merged_seq, best[:, :, None], axis=1)
        fin_done = np.take_along_axis(merged_done, best, axis=1)

        cur_len += 1
        # stop heuristic (early_stopping=False): can the best open beam, at this length, beat the worst finished?
        best_possible = run_score[:, :1] / np.float32(float(cur_len - 1) ** lp)
        worst_finished = np.where(fin_done, fin_score.min(axis=1, keepdims=True), NEG)
        improvable = np.any(best_possible > worst_finished, axis=1)
        finished = ~improvable | hits.all(axis=1) | (cur_len >= max_len)
        for i in np.flatnonzero(finished):
            # a finished hypothesis ends in </s> or fills max_len, so no padding follows its tokens
            results[int(sentences[i])] = fin_seq[i, 0, 2:].tolist()
        if finished.all():
            break
        live = np.flatnonzero(~finished)
        rows = (live[:, None] * k + parents[live]).reshape(-1)  # decoder rows that the surviving beams extend
        engine.select(state, rows)
        tokens = run_seq[live, :, cur_len - 1].reshape(-1)
        run_seq, run_score, parents = run_seq[live], run_score[live], parents[live]
        fin_seq, fin_score, fin_done = fin_seq[live], fin_score[live], fin_done[live]
        sentences = sentences[live]
    engine.release(state)
    return [strip_output(results[i], eos) for i in range(batch)]
