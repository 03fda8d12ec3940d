"""The chunk worker (ChunkWorker): a chunk's rows to their Outcomes, the same for every runner. The rows' sentences
are grouped by target language and sorted by length, so that a batch pads little, cut at max_batch_tokens (rows x
longest row) and max_batch_sentences, each batch through translator.generate, and the ids decoded and joined back
into the rows' Outcomes. A sentence's translation does not depend on its batch, so none of this changes the
output. A sentence the translator cannot take even alone fails its row; the rest go on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..model.engine.numerics import sentence_keys
from ..errors import NllbError
from ..io import Record
from ..options import BatchOptions, DecodeOptions, Job
from .flags import Detect, better_of, flag_rows
from .rows import (Outcome, Sentence, check_placeholders, each_target, flag_names, gather_targets, join_outcomes,
                   prepare_records)

if TYPE_CHECKING:
    from .reader import Finisher
    from ..model.search import Hypothesis
    from ..model.translator import Translator

Advance = Callable[[int, int], None]  # (rows done, tokens generated) since the last call


def ignore(rows: int, tokens: int) -> None:
    """An Advance that reports nowhere."""


@dataclass
class Prepared:
    """A chunk made ready for the model: each row as each_target gives it, its Outcome, its sentences
    tokenized, and their length-sorted batches."""

    copies: list[Record]
    outcomes: list[Outcome]
    sentences: list[Sentence]
    batches: list[Batch]


@dataclass
class ChunkWorker:
    """The one way a chunk's rows become their outcomes, whichever runner runs the chunk: split and tokenized
    (prepare), the batches through the model, decoded and joined (translate), each row's Outcome in the rows'
    order (outcomes). The one-device job prepares the next chunk on its reader's thread and decodes behind the
    model on its finisher's; a worker process, a Ray actor and the API call the worker on a chunk's rows.

    `on_engine` runs a task on the thread that runs the model (a --devices worker's or a Ray actor's, while their
    other threads prepare and decode other chunks); None: the calling thread. With --on-error fail the first bad
    row raises NllbError before any of the chunk is translated.

    Once a chunk is joined its rows get their flags (flags.flag_rows; `detect`: wrong_language's detector, None:
    nllbcli/model/langid.py's), flagged rows are translated again with --retry-flagged (retry_rows) and failed
    with --on-flag fail. The log-probabilities low_score and the retry need are computed whether or not the
    job writes them (--scores)."""

    translator: Translator
    job: Job
    decode: DecodeOptions
    batching: BatchOptions
    on_engine: Callable[[Callable[[], list]], list] | None = None
    detect: Detect | None = None

    def __post_init__(self) -> None:
        self.scores = self.decode.scores or self.job.task == "score"  # the rows' scores are the job's to write
        if self.job.needs_scores and not self.decode.scores:
            self.decode = replace(self.decode, scores=True)  # greedy search's tokens are the same with them

    def __call__(self, records: list[Record], advance: Advance = ignore) -> list[Outcome]:
        prepared = self.prepare(records)
        self.translate(prepared, advance)
        return self.outcomes(prepared)

    def prepare(self, records: list[Record]) -> Prepared:
        """The rows split, checked and tokenized, and their sentences planned into batches. Empty texts stay
        empty, without the model."""
        copies = each_target(records, self.job)
        outcomes, sentences = prepare_records(self.translator, copies, self.job)
        return Prepared(copies, outcomes, sentences,
                        plan_chunk(sentences, self.batching.max_batch_tokens, self.batching.max_batch_sentences))

    def translate(self, prepared: Prepared, advance: Advance = ignore, finisher: Finisher | None = None) -> None:
        """The prepared chunk through the model, its Outcomes filled in (with a finisher, once it has run what
        this gives it). With --retry-flagged the chunk is decoded and joined on this thread: the retry calls the
        model once the flags are known."""
        if self.job.retry_flagged:
            finisher = None
        tally = Tally(prepared.sentences, len(prepared.outcomes), max(1, len(self.job.targets)), advance)
        generated = None
        if self.on_engine is not None:  # every batch on the engine's thread, counted as each ends
            stop = self.job.on_error == "fail"

            def generate_all() -> list[Generated]:
                done = []
                for batch in prepared.batches:
                    done.append(generate_batch_hypotheses(self.translator, batch, self.decode, stop))
                    tally.batch(batch.positions, done[-1][0])
                return done

            generated, tally = self.on_engine(generate_all), None
        translate_prepared(self.translator, prepared.copies, prepared.outcomes, prepared.sentences, self.job,
                           self.decode, tally, finisher, prepared.batches, generated,
                           lambda found: self.finish_rows(prepared, found))

    def finish_rows(self, prepared: Prepared, found: dict[int, list[Hypothesis]]) -> None:
        """The joined rows' flags, the retry of the flagged ones, --on-flag fail; the scores dropped where the
        job does not write them."""
        job, outcomes = self.job, prepared.outcomes
        flag_rows(outcomes, prepared.sentences, found, prepared.copies, job, self.codes(), self.detect)
        if job.retry_flagged:
            self.retry_rows(prepared)
        for record, outcome in zip(prepared.copies, outcomes):
            if not self.scores:
                outcome.log_prob = outcome.score = None
            if job.on_flag == "fail" and outcome.error is None and flag_names(outcome):
                outcome.error = f"{record.where}: flagged {','.join(flag_names(outcome))} (--on-flag fail)"
                outcome.translation = outcome.hypotheses = None
                if job.on_error == "fail":
                    raise NllbError(outcome.error)

    def codes(self) -> tuple[str, ...]:
        """The model's language codes: those wrong_language's detector answers among."""
        return tuple(self.translator.tokenizer.lang_codes)

    def retry_rows(self, prepared: Prepared) -> None:
        """--retry-flagged: each row flagged (but for cut alone) translated again, sentence by sentence, with
        Job.retry_decode's beam search; its flags computed the same way, and the better translation
        (flags.better_of) kept, with `retried` set."""
        rows = [n for n, o in enumerate(prepared.outcomes)
                if o.error is None and [name for name in flag_names(o) if name != "cut"]]
        if not rows:
            return
        job = replace(self.job, split=True, on_error="skip", overwrite_field=True)  # rows that passed once
        decode = job.retry_decode(self.decode)
        records = [prepared.copies[n] for n in rows]
        outcomes, sentences = prepare_records(self.translator, records, job)
        batches = plan_chunk(sentences, self.batching.max_batch_tokens, self.batching.max_batch_sentences)
        generated = None
        if self.on_engine is not None:
            generated = self.on_engine(
                lambda: [generate_batch_hypotheses(self.translator, batch, decode, False) for batch in batches])
        retried: dict[int, list[Hypothesis]] = {}
        translate_prepared(self.translator, records, outcomes, sentences, job, decode, None, None, batches, generated,
                           retried.update)
        flag_rows(outcomes, sentences, retried, records, self.job, self.codes(), self.detect)
        for n, again in zip(rows, outcomes):
            first = prepared.outcomes[n]
            kept = first if again.error is not None else better_of(first, again)
            if kept is again:
                again.cut, again.tokens = first.cut, first.tokens + again.tokens
                prepared.outcomes[n] = again
            else:
                first.tokens += again.tokens
            kept.retried = True

    def outcomes(self, prepared: Prepared) -> list[Outcome]:
        """Each row's Outcome, in the rows' order (with several target languages, its targets' together:
        rows.gather_targets)."""
        return gather_targets(prepared.outcomes, self.job)


class Tally:
    """The rows a chunk's batches finish and the tokens they generate, given to `advance` as each batch ends: a
    row is done with its last sentence, its copies for several targets together."""

    def __init__(self, sentences: list[Sentence], copies: int, targets: int, advance: Advance):
        self.sentences, self.targets, self.advance = sentences, targets, advance
        self.pending = [0] * (copies // targets)  # each row's sentences not translated yet
        for sentence in sentences:
            self.pending[sentence.row // targets] += 1
        advance(sum(p == 0 for p in self.pending), 0)  # rows without a sentence: empty ones, failed ones

    def batch(self, positions: list[int], outputs: list) -> None:
        finished = tokens = 0
        for n, hypotheses in zip(positions, outputs):
            if hypotheses is not None:
                tokens += len(hypotheses[0].ids)
            row = self.sentences[n].row // self.targets
            self.pending[row] -= 1
            finished += self.pending[row] == 0
        self.advance(finished, tokens)


def translate_prepared(translator: Translator, records: list[Record], outcomes: list[Outcome],
                       sentences: list[Sentence], job: Job, decode: DecodeOptions, tally: Tally | None,
                       finisher: Finisher | None, batches: list[Batch], generated: list[Generated] | None,
                       then: Callable[[dict[int, list[Hypothesis]]], None] | None = None) -> None:
    """ChunkWorker.translate's work: the prepared chunk (`records`: its rows as rows.each_target gives them,
    `outcomes` theirs) through the model, its `batches` (plan_chunk's) decoded and joined back into `outcomes`,
    rows in input order. With a finisher, each batch's decoding and the joining run there, behind the next
    batch's generate (the outcomes are complete once the finisher has run them). `generated`: each batch's
    generate_batch_hypotheses, made already (on the engine's thread, which counted them: `tally` None), instead
    of the translator's. `then(found)` runs after the joining, given each sentence's hypotheses by number."""
    tokenizer = translator.tokenizer

    texts: dict[int, list[str]] = {}  # each sentence's hypotheses' texts
    found: dict[int, list[Hypothesis]] = {}
    decode_many = getattr(tokenizer, "decode_many", None) or (lambda outputs: [tokenizer.decode(i) for i in outputs])
    if job.task == "score":  # the translations are the rows' own: nothing to decode
        decode_many = lambda outputs: [""] * len(outputs)  # noqa: E731

    def finish_batch(batch: list[int], outputs: list) -> None:  # decoded, and the rows it finished counted
        done = [(n, hypotheses) for n, hypotheses in zip(batch, outputs) if hypotheses is not None]
        decoded = iter(decode_many([h.ids for _, hypotheses in done for h in hypotheses]))
        for n, hypotheses in done:
            texts[n] = [next(decoded) for _ in hypotheses]
            found[n] = hypotheses
        for n, hypotheses in zip(batch, outputs):
            if hypotheses is not None:
                outcome = outcomes[sentences[n].row]
                outcome.tokens += len(hypotheses[0].ids)
                outcome.max_length |= (job.task == "translate" and
                                       len(hypotheses[0].ids) >= decode.length_limit(len(sentences[n].ids)) - 1)
        if tally is not None:
            tally.batch(batch, outputs)

    run = finisher.submit if finisher is not None else lambda task: task()
    for n, batch in enumerate(batches):
        if generated is None:
            outputs = generate_batch(translator, batch, decode, records, outcomes, job)
        else:
            outputs = record_failures(generated[n], batch, records, outcomes, job)
        run(lambda batch=batch, outputs=outputs: finish_batch(batch.positions, outputs))

    def join() -> None:
        join_outcomes(outcomes, sentences, texts, found, decode, job)
        check_placeholders(records, outcomes, job)

    run(join)
    if then is not None:
        run(lambda: then(found))


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
            given = [sentences[i].target for i in todo] if sentences and sentences[0].target is not None else None
            found = translator.generate_hypotheses(sources, targets, decode, keys, prefixes, given)
            for i, hypotheses in zip(todo, found):
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
