"""Batch planning and decoding: a chunk's sentences grouped by target language and sorted by length, so that a
batch pads little, cut at max_batch_tokens (rows x longest row) and max_batch_sentences, each batch through
translator.generate, and the ids decoded back into the rows' Outcomes. A sentence's translation does not depend on its batch, so none of this
changes the output. A sentence the translator cannot take even alone fails its row; the rest go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..model.engine.numerics import sentence_keys
from ..errors import NllbError
from ..io import Record
from ..options import DecodeOptions, Job
from .rows import Outcome, Sentence, each_target, gather_targets, join_outcomes, prepare_records

if TYPE_CHECKING:
    from .reader import Finisher
    from ..model.search import Hypothesis
    from ..model.translator import Translator

Advance = Callable[[int, int], None]  # (rows done, tokens generated) since the last call


def translate_records(
    translator: Translator,
    records: list[Record],
    job: Job,
    decode: DecodeOptions,
    max_batch_tokens: int,
    advance: Advance = lambda rows, tokens: None,
    max_batch_sentences: int | None = None,
) -> list[Outcome]:
    """What became of each row of a chunk, in the rows' order (with several target languages, each row's
    Outcome holds its targets': rows.gather_targets). Empty texts stay empty, without the model.

    With --on-error fail the first bad row raises NllbError before any of the chunk is translated."""
    copies = each_target(records, job)
    outcomes, sentences = prepare_records(translator, copies, job)
    translate_prepared(translator, copies, outcomes, sentences, job, decode, max_batch_tokens, advance,
                       max_batch_sentences=max_batch_sentences)
    return gather_targets(outcomes, job)


def translate_chunk(translator: Translator, records: list[Record], job: Job, decode: DecodeOptions,
                    max_batch_tokens: int, max_batch_sentences: int | None = None,
                    on_engine: Callable[[Callable[[], list]], list] = lambda task: task()) -> tuple[list[Outcome], int, int]:
    """A chunk of rows through a worker that does all of a chunk's work (a --devices worker process, a Ray actor):
    split and tokenized, its batches through the model by `on_engine` (which runs a task on the thread that runs
    the model, while the worker's other threads prepare and decode other chunks), decoded and joined. Each row's
    Outcome (gather_targets: the rows' order), the rows done and the tokens generated. With --on-error fail the
    first bad row raises NllbError, as translate_records does."""
    copies = each_target(records, job)
    outcomes, sentences = prepare_records(translator, copies, job)
    batches = plan_chunk(sentences, max_batch_tokens, max_batch_sentences)
    stop = job.on_error == "fail"
    generated = on_engine(lambda: [generate_batch_hypotheses(translator, batch, decode, stop) for batch in batches])
    counts = [0, 0]

    def advance(rows: int, tokens: int) -> None:
        counts[0] += rows
        counts[1] += tokens

    translate_prepared(translator, copies, outcomes, sentences, job, decode, max_batch_tokens, advance, batches=batches,
                       generated=generated)
    return gather_targets(outcomes, job), counts[0], counts[1]


def translate_prepared(translator: Translator, records: list[Record], outcomes: list[Outcome],
                       sentences: list[Sentence], job: Job, decode: DecodeOptions, max_batch_tokens: int,
                       advance: Advance = lambda rows, tokens: None, finisher: "Finisher | None" = None,
                       batches: list[Batch] | None = None, generated: list[Generated] | None = None,
                       max_batch_sentences: int | None = None) -> list[Outcome]:
    """The prepared chunk (`records`: its rows as rows.each_target gives them, `outcomes` theirs) through the
    model: its sentences in length-sorted batches (plan_chunk's, made here
    unless given), decoded and joined back into `outcomes` (returned), rows in input order. With a finisher,
    each batch's decoding and the joining run there, behind the next batch's generate (the outcomes are
    complete once the finisher has run them). `generated`: each batch's generate_batch_hypotheses, made already (on
    another thread: translate_chunk), instead of the translator's."""
    tokenizer = translator.tokenizer
    copies = max(1, len(job.targets))  # `records` holds each row's copies, one per target (rows.each_target)
    pending = [0] * (len(records) // copies)  # each row's sentences not translated yet, its copies' together
    for sentence in sentences:
        pending[sentence.row // copies] += 1
    done_rows = [p == 0 for p in pending]
    advance(sum(done_rows), 0)

    texts: dict[int, list[str]] = {}  # each sentence's hypotheses' texts
    found: dict[int, list[Hypothesis]] = {}
    decode_many = getattr(tokenizer, "decode_many", None) or (lambda outputs: [tokenizer.decode(i) for i in outputs])

    def finish_batch(batch: list[int], outputs: list) -> None:  # decoded, and the rows it finished counted
        done = [(n, hypotheses) for n, hypotheses in zip(batch, outputs) if hypotheses is not None]
        decoded = iter(decode_many([h.ids for _, hypotheses in done for h in hypotheses]))
        for n, hypotheses in done:
            texts[n] = [next(decoded) for _ in hypotheses]
            found[n] = hypotheses
        finished = tokens = 0
        for n, hypotheses in zip(batch, outputs):
            row = sentences[n].row
            if hypotheses is not None:
                best = hypotheses[0].ids
                tokens += len(best)
                if len(best) >= decode.length_limit(len(sentences[n].ids)) - 1:
                    outcomes[row].max_length = True
            pending[row // copies] -= 1
            finished += pending[row // copies] == 0
        advance(finished, tokens)

    run = finisher.submit if finisher is not None else lambda task: task()
    planned = plan_chunk(sentences, max_batch_tokens, max_batch_sentences) if batches is None else batches
    for n, batch in enumerate(planned):
        if generated is None:
            outputs = generate_batch(translator, batch, decode, records, outcomes, job)
        else:
            outputs = record_failures(generated[n], batch, records, outcomes, job)
        run(lambda batch=batch, outputs=outputs: finish_batch(batch.positions, outputs))
    run(lambda: join_outcomes(outcomes, sentences, texts, found, decode))
    return outcomes


@dataclass
class Batch:
    """A batch of a chunk's sentences, made ready for the translator on the reader's thread."""

    positions: list[int]  # the sentences' numbers in the chunk
    sentences: list[Sentence]
    sources: list[list[int]]  # their ids
    targets: list[str]  # their target languages (a batch may mix them)


def plan_chunk(sentences: list[Sentence], max_batch_tokens: int, max_batch_sentences: int | None = None) -> list[Batch]:
    """plan_batches over a chunk's sentences, each batch with what translator.generate takes. Sentences of the
    same ids (a row's copies for several target languages, a sentence repeated) are kept in one batch where the
    limits allow: search.generate runs the encoder once for them."""
    batches = []
    lengths = {n: len(s.ids) for n, s in enumerate(sentences)}
    first: dict[tuple, int] = {}  # each distinct source's first sentence: its group
    groups = {n: first.setdefault(tuple(s.ids), n) for n, s in enumerate(sentences)}
    for positions in plan_batches(lengths, max_batch_tokens, max_batch_sentences, groups):
        batch = [sentences[n] for n in positions]
        batches.append(Batch(positions, batch, [s.ids for s in batch], [s.tgt for s in batch]))
    return batches


Generated = tuple[list, list]  # a batch's hypotheses (None for a failed sentence), and its failures: (row, reason)


def generate_batch(translator, batch: Batch, decode: DecodeOptions, records: list[Record],
                   outcomes: list[Outcome], job: Job) -> list[list[Hypothesis] | None]:
    """The batch's hypotheses; a sentence the translator cannot take even alone fails its row (None) and the
    rest of the batch goes on."""
    return record_failures(generate_batch_hypotheses(translator, batch, decode, job.on_error == "fail"), batch, records,
                           outcomes, job)


def generate_batch_hypotheses(translator, batch: Batch, decode: DecodeOptions, stop: bool) -> Generated:
    """The batch through translator.generate_hypotheses: each sentence's hypotheses, and the rows whose sentence
    it cannot take even alone, with the reason; such a row's other sentences are left out and the rest go on
    (`stop`: the first failure ends the batch, as --on-error fail stops the job on it)."""
    from ..model.translator import SentenceError

    sentences = batch.sentences
    outputs: list[list[Hypothesis] | None] = [None] * len(sentences)
    failures: list[tuple[int, str]] = []
    todo = list(range(len(sentences)))
    sources, targets = batch.sources, batch.targets  # the whole batch, as the reader made it ready
    while todo:
        try:
            keys = None
            if decode.sampling and decode.seed is not None:  # each sentence's stream: the seed and its place
                places = np.array([sentences[i].place for i in todo], dtype=np.int64).reshape(-1, 2)
                keys = sentence_keys(decode.seed, places[:, 0], places[:, 1])
            prefixes = [sentences[i].prefix for i in todo] if any(sentences[i].prefix for i in todo) else None
            for i, hypotheses in zip(todo, translator.generate_hypotheses(sources, targets, decode, keys, prefixes)):
                outputs[i] = hypotheses
            break
        except SentenceError as error:
            row = sentences[todo[error.position]].row
            failures.append((row, str(error)))
            if stop:
                break
            todo = [i for i in todo if sentences[i].row != row]  # the row's other sentences are of no use now
            sources, targets = [sentences[i].ids for i in todo], [sentences[i].tgt for i in todo]
    return outputs, failures


def record_failures(generated: Generated, batch: Batch, records: list[Record], outcomes: list[Outcome],
                    job: Job) -> list[list[Hypothesis] | None]:
    """A batch's hypotheses, its failed rows given their reason (with --on-error fail, the first stops the job)."""
    outputs, failures = generated
    for row, reason in failures:
        message = f"{records[row].where}: {reason}"
        if job.on_error == "fail":
            raise NllbError(message)
        outcomes[row].error = message
    return outputs


def plan_batches(lengths: dict[int, int], max_batch_tokens: int, max_batch_sentences: int | None = None,
                 groups: dict[int, int] | None = None) -> list[list[int]]:
    """Group positions longest first, each batch within rows x longest row <= max_batch_tokens and within
    max_batch_sentences rows (None: any number). Positions of one group (`groups`: position -> group) come
    together, and a batch that would end inside a group leaves the group's positions it holds to the next batch
    where they fit there and are not the whole batch.

    A row longer than the budget goes alone. Longest first, so a batch too large for memory fails early.
    """
    group = groups.__getitem__ if groups is not None else lambda position: position

    def full(batch: list[int]) -> bool:  # no room for another position of the batch's longest length
        return (len(batch) + 1) * lengths[batch[0]] > max_batch_tokens or len(batch) == max_batch_sentences

    batches: list[list[int]] = []
    batch: list[int] = []
    for position in sorted(lengths, key=lambda p: (-lengths[p], group(p))):
        if batch and full(batch):
            run = len(batch)  # where the batch's last positions of this position's group begin
            while run > 0 and group(batch[run - 1]) == group(position):
                run -= 1
            if 0 < run < len(batch) and not full(batch[run:]):
                batches.append(batch[:run])
                batch = batch[run:]
            else:
                batches.append(batch)
                batch = []
        batch.append(position)
    if batch:
        batches.append(batch)
    return batches
