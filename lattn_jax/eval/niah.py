"""Needle in a haystack, RULER ``niah_single_{1,2,3}`` and ``niah_multikey_1`` (Hsieh et al. 2024).

A sample hides one needle sentence ``"One of the special magic {numbers|uuids} for {key} is:
{value}."`` in a haystack and asks for it back (spec ``hypenet-halo.md`` §4.2):

* ``niah_single_1``: noise haystack, the block "The grass is green. The sky is blue. The sun is
  yellow. Here we go. There and back again." repeated and joined by newlines; 7-digit number;
* ``niah_single_2``: essay haystack (the Paul Graham essays of ``shared/data/niah``, concatenated
  in file-name order, whitespace collapsed, split into words); 7-digit number;
* ``niah_single_3``: essay haystack; UUID4 value;
* ``niah_multikey_1`` (:data:`MULTIKEY_TASKS`): essay haystack with ``MULTIKEY_NEEDLES = 4``
  needles of distinct keys and 7-digit values; the prompt asks for the first one, placed at the
  requested depth, the three distractors at uniformly drawn depths (RULER ``niah_multikey_1``
  with ``num_needle_k = 4``; lm-eval ``tasks/ruler``).

Prompt (RULER's base-model template, then its answer prefix)::

    A special magic {number|uuid} is hidden within the following text. Make sure to memorize it.
    I will quiz you about the {number|uuid} afterwards.
    {context}
    What is the special magic {number|uuid} for {key} mentioned in the provided text? \\
The special magic {number|uuid} for {key} mentioned in the provided text is

Haystack size: the largest haystack (number of noise blocks, or essay words) such that the
prompt plus ``max_new_tokens`` tokens fits in the target length, measured with the model's
tokenizer (RULER grows it until it no longer fits; we binary-search the same bound).

Depth ``d`` in [0, 100] places the needle at index ``round(n * d / 100)`` among the ``n`` noise
blocks, or among the essay's sentences (RULER: ``int(len(sentences) * d / 100)``; sentences are
split at ``.``, ``!`` or ``?`` followed by whitespace instead of with NLTK's Punkt). RULER draws
the single_1 insertion point uniformly; here it follows the requested depth so that every task
fills a length x depth grid. Keys are adjective-noun pairs from a fixed word list (RULER uses the
``wonderwords`` lists).

:class:`SampleBuilder` gives the same samples as :func:`make_sample` together with their token
ids, fast enough for thousands of prompts of up to 64K+ tokens: token counts come from cached
encodings of the prompt's space-separated pieces (:class:`PieceTokenizer`, exact for GPT-2-style
byte-level BPE and checked against the tokenizer), and for the essay haystacks from prefix sums
over the essay's words.

Scoring is lenient, RULER's ``string_match_all``: 1 if the needle value occurs in the generated
text (case-insensitive), else 0; generation is greedy.
"""

import dataclasses
import glob
import itertools
import os
import random
import re
import uuid
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax.data import tokenizers as tok_lib

TASKS = ("niah_single_1", "niah_single_2", "niah_single_3")
MULTIKEY_TASKS = ("niah_multikey_1",)
ALL_TASKS = TASKS + MULTIKEY_TASKS
MULTIKEY_NEEDLES = 4
NOISE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
         "There and back again.")
_ADJECTIVES = ("abundant", "brave", "calm", "curious", "damp", "eager", "fancy", "gentle",
               "glossy", "hollow", "icy", "jolly", "keen", "lively", "mellow", "nimble", "odd",
               "proud", "quiet", "rapid", "shiny", "tidy", "vast", "witty", "young", "zesty")
_NOUNS = ("anchor", "badger", "candle", "dolphin", "engine", "falcon", "garden", "harbor",
          "island", "jacket", "kettle", "lantern", "meadow", "needle", "orchard", "pepper",
          "quartz", "river", "saddle", "tunnel", "umbrella", "violin", "walnut", "yarn", "zebra")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One NIAH prompt.

    Attributes:
      task: one of :data:`ALL_TASKS`.
      prompt: the full input text (ends with the answer prefix).
      value: the needle value the answer must contain.
      key: the needle's key.
      depth: requested depth in percent.
      length: target length in tokens.
      needle_char: character offset of the needle sentence inside ``prompt``.
      context_chars: ``(start, end)`` character span of the haystack inside ``prompt``.
      num_tokens: tokens in ``prompt``.
      haystack_units: noise blocks or essay words in the haystack (:func:`build_prompt`).
    """

    task: str
    prompt: str
    value: str
    key: str
    depth: float
    length: int
    needle_char: int
    context_chars: tuple
    num_tokens: int
    haystack_units: int = 0


def load_essays(directory: str) -> List[str]:
    """Words of the concatenated essays (``*.txt`` in file-name order), whitespace collapsed.

    Raises:
      FileNotFoundError: if ``directory`` holds no ``.txt`` file.
    """
    files = sorted(glob.glob(os.path.join(directory, "*.txt")))
    if not files:
        raise FileNotFoundError(f"no haystack essays (*.txt) in {directory} (set --data_dir to "
                                f"the directory laid out as shared/data, with niah/"
                                f"PaulGrahamEssays)")
    text = " ".join(open(f, encoding="utf-8").read() for f in files)
    return re.sub(r"\s+", " ", text).strip().split(" ")


def needle_value(task: str, rng: random.Random) -> str:
    """A 7-digit number (single_1/2) or a UUID4 string (single_3)."""
    if task == "niah_single_3":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return str(rng.randint(10 ** 6, 10 ** 7 - 1))


def _kind(task: str) -> str:
    return "uuid" if task == "niah_single_3" else "number"


def build_prompt(task: str, haystack_units: int, depth: float, key: str, value: str,
                 essay_words: Optional[Sequence[str]] = None,
                 distractors: Sequence[Tuple[str, str, float]] = ()) -> Sample:
    """Assembles a prompt with ``haystack_units`` noise blocks or essay words.

    Args:
      task: one of :data:`ALL_TASKS`.
      haystack_units: noise blocks (single_1) or essay words (the others), >= 0.
      depth: needle depth in percent, 0 (start) to 100 (end).
      key, value: the needle's key and value (the one asked for).
      essay_words: the essay words (all tasks but single_1).
      distractors: ``(key, value, depth)`` of further needles (multikey tasks), inserted at
        their depths like the main one (before it at the same index).

    Returns:
      A :class:`Sample` with ``length`` and ``num_tokens`` left at 0.

    Raises:
      ValueError: for an unknown task, a depth outside [0, 100] or missing essay words.
    """
    if task not in ALL_TASKS:
        raise ValueError(f"unknown NIAH task {task!r}; choose from {', '.join(ALL_TASKS)}")
    if not all(0 <= d <= 100 for d in [depth] + [d for _, _, d in distractors]):
        raise ValueError(f"depth must be in [0, 100] percent, got {depth=}")
    kind = _kind(task)
    needle = f"One of the special magic {kind}s for {key} is: {value}."
    if task == "niah_single_1":
        pieces, sep = [NOISE] * haystack_units, "\n"
    else:
        if not essay_words:
            raise ValueError(f"{task} needs essay_words (none given)")
        words = list(itertools.islice(itertools.cycle(essay_words), haystack_units))
        pieces, sep = (_SENTENCE_END.split(" ".join(words)) if words else []), " "
    at = int(round(len(pieces) * depth / 100.0)) if task == "niah_single_1" else int(
        len(pieces) * depth / 100.0)
    if distractors:
        inserts = sorted([(int(len(pieces) * d / 100.0), 0, f"One of the special magic {kind}s "
                           f"for {k} is: {v}.") for k, v, d in distractors] + [(at, 1, needle)])
        parts = []
        for i in range(len(pieces) + 1):
            parts += [text for pos, _, text in inserts if pos == i]
            parts += pieces[i:i + 1]
        pieces, at = parts, parts.index(needle)
        pieces = pieces[:at] + pieces[at + 1:]
    before, after = sep.join(pieces[:at]), sep.join(pieces[at:])
    context = sep.join(p for p in (before, needle, after) if p)
    head = (f"A special magic {kind} is hidden within the following text. Make sure to memorize "
            f"it. I will quiz you about the {kind} afterwards.\n")
    tail = (f"\nWhat is the special magic {kind} for {key} mentioned in the provided text? "
            f"The special magic {kind} for {key} mentioned in the provided text is")
    prompt = head + context + tail
    needle_char = len(head) + (len(before) + len(sep) if before else 0)
    return Sample(task=task, prompt=prompt, value=value, key=key, depth=depth, length=0,
                  needle_char=needle_char, context_chars=(len(head), len(head) + len(context)),
                  num_tokens=0, haystack_units=haystack_units)


def _draw_needles(task: str, rng: random.Random) -> Tuple[str, str, List[Tuple[str, str, float]]]:
    """The key, value and distractor needles ``(key, value, depth)`` of one sample, in the
    order :func:`make_sample` draws them from ``rng``."""
    key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
    value = needle_value(task, rng)
    distractors = []
    if task in MULTIKEY_TASKS:
        keys = {key}
        while len(keys) < MULTIKEY_NEEDLES:
            k = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
            if k not in keys:
                keys.add(k)
                distractors.append((k, needle_value(task, rng), 100.0 * rng.random()))
    return key, value, distractors


class PromptTooLong(ValueError):
    """Not even an empty haystack fits: ``task``'s prompt has ``empty`` tokens without one,
    more than ``length`` minus ``max_new_tokens`` answer tokens; ``empty + max_new_tokens`` is
    the shortest length that fits (:attr:`shortest`)."""

    def __init__(self, task: str, length: int, empty: int, max_new_tokens: int):
        super().__init__(f"{task}: the prompt without haystack has {empty} tokens, more than "
                         f"length {length} minus {max_new_tokens} answer tokens")
        self.task, self.length, self.empty = task, length, empty
        self.max_new_tokens = max_new_tokens
        self.shortest = empty + max_new_tokens


def _largest_haystack(count: Callable[[int], int], budget: int, task: str, length: int,
                      max_new_tokens: int, start_units: Optional[int]) -> int:
    """The largest ``n`` with ``count(n) <= budget`` (``count`` non-decreasing in ``n``).

    Gallops outwards from ``start_units`` (steps 1, 2, 4, ...) when given, else doubles from 1,
    then bisects; ``count`` is called a few times for a good guess, about ``2 log2(n)`` times
    without one.

    Raises:
      PromptTooLong: (a ``ValueError``) if ``count(0) > budget`` (not even an empty haystack
        fits).
    """
    empty = count(0)
    if empty > budget:
        raise PromptTooLong(task, length, empty, max_new_tokens)
    lo, hi = 0, 1
    if start_units is not None and start_units > 0:
        # Gallop from the guess: lo fits, hi does not.
        step = 1
        if count(start_units) <= budget:
            lo, hi = start_units, start_units + step
            while count(hi) <= budget:
                lo, hi, step = hi, hi + step, step * 2
        else:
            hi, lo = start_units, max(0, start_units - step)
            while lo > 0 and count(lo) > budget:
                hi, lo, step = lo, max(0, lo - step), step * 2
    else:
        while count(hi) <= budget:  # grow until it no longer fits
            lo, hi = hi, hi * 2
    while hi - lo > 1:  # the largest haystack that fits lies in [lo, hi)
        mid = (lo + hi) // 2
        if count(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def make_sample(task: str, tokenizer: tok_lib.Tokenizer, length: int, depth: float,
                rng: random.Random, essay_words: Optional[Sequence[str]] = None,
                max_new_tokens: int = 32, start_units: Optional[int] = None) -> Sample:
    """The largest-haystack prompt with ``num_tokens + max_new_tokens <= length``.

    Args:
      task, depth, essay_words: as for :func:`build_prompt`.
      tokenizer: measures lengths (no BOS/EOS).
      length: target length in tokens.
      rng: draws the key and value.
      max_new_tokens: room left for the answer.
      start_units: a guess of the answer (e.g. the ``haystack_units`` of another sample of the
        same length): the search gallops outwards from it, a few tokenizations instead of about
        ``2 log2(n)`` for long prompts. The result is the same (the largest haystack that fits,
        token counts growing with the haystack).

    Raises:
      PromptTooLong: (a ``ValueError``) if even an empty haystack does not fit in ``length``.
    """
    key, value, distractors = _draw_needles(task, rng)
    built: Dict[int, Tuple[Sample, int]] = {}

    def build(n):
        if n not in built:
            s = build_prompt(task, n, depth, key, value, essay_words, distractors)
            built[n] = (s, len(tokenizer.encode(s.prompt)))
        return built[n]

    n = _largest_haystack(lambda n: build(n)[1], length - max_new_tokens, task, length,
                          max_new_tokens, start_units)
    sample, n_tokens = build(n)
    return dataclasses.replace(sample, length=length, num_tokens=n_tokens)


# A piece boundary: a space right after a non-whitespace character.
_PIECE_BOUNDARY = re.compile(r"(?<=\S)(?= )")
_WHITESPACE_THEN_SPACE = re.compile(r"\s ")


class PieceTokenizer:
    """Encodes a text as the concatenated, cached encodings of its *pieces*.

    A text is cut before every space that follows a non-whitespace character (``"a b\nc d"``
    -> ``"a"``, ``" b\nc"``, ``" d"``); each distinct piece is encoded once with the wrapped
    tokenizer. This equals encoding the whole text for tokenizers whose pre-tokenizer always
    starts a new pre-token there, e.g. GPT-2-style byte-level BPE (the GGUF ``gpt2`` models such
    as SmolLM2: every regex alternative stops before a space that follows a non-space, and BPE
    never merges across pre-tokens), but not for SentencePiece with a dummy prefix;
    :meth:`matches` checks it on given texts. A 64K-token NIAH prompt is counted in about 5 ms
    this way instead of about 250 ms (GGUF tokenizer, one CPU core).

    Args:
      tokenizer: the wrapped tokenizer (``encode``, ``encode_batch``).
    """

    def __init__(self, tokenizer: tok_lib.Tokenizer):
        self.tokenizer = tokenizer
        self._first: Dict[str, np.ndarray] = {}  # piece -> int32 ids
        self._spaced: Dict[str, np.ndarray] = {}  # word -> ids of " " + word
        self._spaced_len: Dict[str, int] = {}

    def _split(self, text: str) -> Tuple[str, List[str]]:
        """``(first piece, words)``: the pieces are ``first`` and ``" " + w`` per word."""
        if _WHITESPACE_THEN_SPACE.search(text) is None:  # every space starts a piece
            first, *words = text.split(" ")
            return first, words
        first, *rest = _PIECE_BOUNDARY.split(text)
        return first, [p[1:] for p in rest]

    def _fill(self, first: str, words: Sequence[str]) -> None:
        if first not in self._first:
            self._first[first] = np.asarray(self.tokenizer.encode(first), np.int32)
        missing = [w for w in set(words) if w not in self._spaced]
        if missing:
            for w, ids in zip(missing, self.tokenizer.encode_batch([" " + w for w in missing])):
                self._spaced[w] = np.asarray(ids, np.int32)
                self._spaced_len[w] = len(ids)

    def count(self, text: str) -> int:
        """The number of tokens of ``text`` (sum over its pieces)."""
        first, words = self._split(text)
        try:
            return len(self._first[first]) + sum(map(self._spaced_len.__getitem__, words))
        except KeyError:
            self._fill(first, words)
            return len(self._first[first]) + sum(map(self._spaced_len.__getitem__, words))

    def encode(self, text: str) -> np.ndarray:
        """int32 ``[num_tokens]``: the concatenated ids of the pieces of ``text``."""
        first, words = self._split(text)
        self._fill(first, words)
        return np.concatenate([self._first[first]] + [self._spaced[w] for w in words])

    def matches(self, texts: Sequence[str]) -> bool:
        """Whether :meth:`encode` equals the wrapped tokenizer's ``encode`` on every text."""
        return all(np.array_equal(self.encode(t), np.asarray(self.tokenizer.encode(t), np.int32))
                   for t in texts)


class _EssayPieces:
    """Token counts and ids of the essay haystack ``" ".join(words[:n])`` (words cycled), as
    prefix sums over the pieces ``" " + word`` of :class:`PieceTokenizer`, and the word index of
    every sentence start that :func:`build_prompt` splits at."""

    def __init__(self, pieces: PieceTokenizer, words: Sequence[str]):
        if not words:
            raise ValueError("the essay haystack has no words")
        self.words = list(words)
        pieces._fill("", self.words)
        lens = np.asarray([len(pieces._spaced[w]) for w in self.words], np.int64)
        self._cycle_ids = np.concatenate([pieces._spaced[w] for w in self.words])
        self._cycle_lens = lens
        # Words ending a sentence (RULER-style split at [.!?] followed by whitespace).
        self._cycle_ends = np.asarray([w[-1] in ".!?" for w in self.words], bool)
        self.size = 0
        self._extend(len(self.words))

    def _extend(self, n: int) -> None:
        cycles = max(1, -(-n // len(self.words)))
        if cycles * len(self.words) <= self.size:
            return
        self.flat = np.tile(self._cycle_ids, cycles)  # ids of " " + words[i], concatenated
        self.offsets = np.concatenate([[0], np.cumsum(np.tile(self._cycle_lens, cycles))])
        self.end_words = np.flatnonzero(np.tile(self._cycle_ends, cycles))
        self.size = cycles * len(self.words)

    def word(self, i: int) -> str:
        return self.words[i % len(self.words)]

    def needle_word(self, n: int, depth: float) -> int:
        """The word index before which :func:`build_prompt` puts the needle (``n >= 1``)."""
        self._extend(n + 1)
        splits = int(np.searchsorted(self.end_words, n - 1))  # sentence ends among words < n-1
        num_sentences = 1 + splits
        at = int(num_sentences * depth / 100.0)  # the expression of build_prompt
        if at == 0:
            return 0
        if at < num_sentences:
            return int(self.end_words[at - 1]) + 1
        return n

    def bulk_count(self, a: int, b: int) -> int:
        """Tokens of the pieces ``" " + words[i]`` for ``a <= i < b``."""
        self._extend(b + 1)
        return int(self.offsets[b] - self.offsets[a]) if b > a else 0

    def bulk_ids(self, a: int, b: int) -> np.ndarray:
        self._extend(b + 1)
        return self.flat[self.offsets[a]:self.offsets[b]] if b > a else self.flat[:0]


class SampleBuilder:
    """:func:`make_sample`, fast: the same samples, plus their token ids, for long prompts.

    :func:`make_sample` tokenizes the whole prompt for every haystack size it tries (about 1.5
    s per 64K-token prompt with SmolLM2's GGUF tokenizer). Here token counts and ids come from a
    :class:`PieceTokenizer`, checked at construction against the tokenizer itself on the whole
    essay text and on prompts of every task; for the essay tasks (``niah_single_2/3``) the
    haystack's tokens are prefix sums over the essay's words, so a haystack size is tried in
    microseconds and the ids are array slices. Where the check fails (``exact`` is ``False``,
    e.g. SentencePiece), every call falls back to :func:`make_sample` and ``tokenizer.encode``.

    The prompt for a haystack size ``n`` is always :func:`build_prompt`'s, and the search is
    :func:`make_sample`'s, so the samples are identical wherever the piece counts equal the
    tokenizer's (``tests/lattn_jax/eval/niah_test.py`` compares both).

    Args:
      tokenizer: measures lengths and gives the ids (no BOS/EOS).
      essay_words: from :func:`load_essays` (``None`` if only ``niah_single_1`` is built).
    """

    def __init__(self, tokenizer: tok_lib.Tokenizer,
                 essay_words: Optional[Sequence[str]] = None):
        self.tokenizer = tokenizer
        self.essay_words = essay_words
        self.pieces = PieceTokenizer(tokenizer)
        probes = []
        for task in ALL_TASKS if essay_words else ("niah_single_1",):
            for units, depth in ((40, 37.0), (400, 0.0), (400, 100.0)):
                key, value, distractors = _draw_needles(task, random.Random(units))
                probes.append(build_prompt(task, units, depth, key, value, essay_words,
                                           distractors).prompt)
        if essay_words:
            probes.append(" ".join(essay_words))
        self.exact = self.pieces.matches(probes)
        self._essay = _EssayPieces(self.pieces, essay_words) if (self.exact and essay_words) \
            else None

    def make_sample(self, task: str, length: int, depth: float, rng: random.Random,
                    max_new_tokens: int = 32,
                    start_units: Optional[int] = None) -> Tuple[Sample, np.ndarray]:
        """``(sample, ids)``: ``make_sample(task, tokenizer, length, depth, rng, essay_words,
        max_new_tokens, start_units)`` and its prompt's token ids (int32 ``[num_tokens]``).

        Raises:
          ValueError: as :func:`make_sample` (an unknown task, a bad depth, no essay words, a
            length too short for the prompt).
        """
        if task not in ALL_TASKS:
            raise ValueError(f"unknown NIAH task {task!r}; choose from {', '.join(ALL_TASKS)}")
        if not self.exact:
            s = make_sample(task, self.tokenizer, length, depth, rng, self.essay_words,
                            max_new_tokens, start_units)
            return s, np.asarray(self.tokenizer.encode(s.prompt), np.int32)
        key, value, distractors = _draw_needles(task, rng)
        words = self.essay_words
        essay = task in ("niah_single_2", "niah_single_3") and bool(words)
        if essay:
            empty = build_prompt(task, 0, depth, key, value, words)
            start, end = empty.context_chars
            head, needle, tail = (empty.prompt[:start], empty.prompt[start:end],
                                  empty.prompt[end:])
            parts = lambda n: self._essay_parts(head, needle, tail, n, depth)  # noqa: E731
            count = lambda n: sum(  # noqa: E731
                self.pieces.count(p) if isinstance(p, str) else self._essay.bulk_count(*p)
                for p in parts(n))
        else:
            count = lambda n: self.pieces.count(  # noqa: E731
                build_prompt(task, n, depth, key, value, words, distractors).prompt)
        n = _largest_haystack(count, length - max_new_tokens, task, length, max_new_tokens,
                              start_units)
        sample = build_prompt(task, n, depth, key, value, words, distractors)
        if essay:
            ids = np.concatenate([self.pieces.encode(p) if isinstance(p, str)
                                  else self._essay.bulk_ids(*p) for p in parts(n)])
        else:
            ids = self.pieces.encode(sample.prompt)
        return dataclasses.replace(sample, length=length, num_tokens=len(ids)), ids

    def _essay_parts(self, head: str, needle: str, tail: str, n: int, depth: float) -> list:
        """The prompt of an essay task with ``n`` words as literal strings and word ranges
        ``(a, b)`` (the pieces ``" " + words[i]``, ``a <= i < b``), cut at piece boundaries:
        their concatenation is :func:`build_prompt`'s text ``head + context + tail``."""
        if n == 0:
            return [head + needle + tail]
        ess = self._essay
        k = ess.needle_word(n, depth)
        if k == 0:
            return [head + needle, (0, n - 1), " " + ess.word(n - 1) + tail]
        if k == n:
            return [head + ess.word(0), (1, n), " " + needle + tail]
        return [head + ess.word(0), (1, k), " " + needle, (k, n - 1),
                " " + ess.word(n - 1) + tail]


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER's score: the fraction of ``references`` contained in ``prediction`` (case-folded)."""
    return sum(r.lower() in prediction.lower() for r in references) / len(references)


# How a greedy answer relates to the needle's value (:func:`answer_mode`), in table order.
ANSWER_MODES = ("value_first", "value_later", "partial_value", "no_value")


def answer_mode(prediction: str, value: str) -> str:
    """Which of :data:`ANSWER_MODES` a greedy answer is, for one needle ``value``.

    Separates the ways a NIAH answer misses (case-folded, as :func:`string_match_all`):

    * ``value_first``: the answer starts with the value, after whitespace and ``:``/``"``/``'``
      (a hit);
    * ``value_later``: the value appears later in the answer (a hit under
      ``string_match_all``, after some other text);
    * ``partial_value``: no whole value, but the answer holds its first half or more (at least
      4 characters): the model retrieved the needle and then miscopied it, or ran out of
      decoding steps;
    * ``no_value``: not even the value's first half: the model did not retrieve it, or wrote
      something else first and never came back to it.

    Args:
      prediction: the decoded answer.
      value: the needle value (7-digit number or UUID).

    Returns:
      One of :data:`ANSWER_MODES`.

    Raises:
      ValueError: an empty ``value``.
    """
    if not value:
        raise ValueError("answer_mode needs a non-empty needle value")
    text, gold = prediction.lower(), value.lower()
    if text.lstrip(" \t\n:\"'").startswith(gold):
        return "value_first"
    if gold in text:
        return "value_later"
    half = max(4, -(-len(gold) // 2))
    if len(gold) > half and gold[:half] in text:
        return "partial_value"
    return "no_value"


class OutOfMemory(Exception):
    """``generate_fn`` ran out of device memory (XLA's ``RESOURCE_EXHAUSTED``) on the prompts
    of ``task`` at ``length`` tokens; ``error`` is its error (also the ``__cause__``)."""

    def __init__(self, task: str, length: int, error: BaseException):
        super().__init__(f"{task} at length {length}: {error}")
        self.task, self.length, self.error = task, length, error


def build_samples(task: str, tokenizer: tok_lib.Tokenizer, *, lengths: Sequence[int],
                  depths: Sequence[float], samples_per_cell: int = 1,
                  essay_words: Optional[Sequence[str]] = None, max_new_tokens: int = 32,
                  seed: int = 42) -> List[List[Sample]]:
    """The prompts :func:`run` scores for ``task``, built before any of them is generated.

    Args:
      task: a name from :data:`ALL_TASKS`.
      tokenizer, lengths, depths, samples_per_cell, essay_words, max_new_tokens, seed: as for
        :func:`run`.

    Returns:
      One list per length (in ``lengths``' order) of ``len(depths) * samples_per_cell``
      samples, depth-major, drawn from one ``random.Random(seed)`` in that order.

    Raises:
      ValueError: for an unknown task; :class:`PromptTooLong` (a ``ValueError``) when a length
        is too short for even an empty haystack.
    """
    if task not in ALL_TASKS:
        raise ValueError(f"unknown NIAH task {task!r}; choose from {', '.join(ALL_TASKS)}")
    rng = random.Random(seed)
    return [[make_sample(task, tokenizer, length, d, rng, essay_words, max_new_tokens)
             for d in depths for _ in range(samples_per_cell)] for length in lengths]


def run(generate_fn, tokenizer: tok_lib.Tokenizer, *, tasks: Sequence[str],
        lengths: Sequence[int], depths: Sequence[float], samples_per_cell: int = 1,
        essay_words: Optional[Sequence[str]] = None, max_new_tokens: int = 32,
        seed: int = 42,
        samples: Optional[Dict[str, List[List[Sample]]]] = None) -> Dict[str, dict]:
    """Evaluates a length x depth grid for each task.

    Args:
      generate_fn: ``f(list of prompt id lists, max_new_tokens) -> list of generated id lists``
        (greedy).
      tokenizer: encodes prompts and decodes answers.
      tasks: names from :data:`ALL_TASKS`.
      lengths: target lengths in tokens.
      depths: needle depths in percent.
      samples_per_cell: prompts per (length, depth).
      essay_words: from :func:`load_essays` (needed for single_2/3).
      max_new_tokens: answer length.
      seed: key/value seed (RULER uses 42).
      samples: ``{task: build_samples(task, ...)}`` built beforehand with the same arguments
        (a caller checks every length before scoring anything); a task not in it is built here.

    Returns:
      ``{task: {"grid": [len(lengths), len(depths)] scores, "lengths", "depths", "mean",
      "per_length": {length: mean}, "examples": [first few (prompt tail, answer, value)]}}``.

    Raises:
      ValueError: for an unknown task; :class:`PromptTooLong` for a length too short for the
        prompt (every length of a task is built before its first is generated).
      OutOfMemory: ``generate_fn`` ran out of device memory (naming the task and length);
        any other error of it propagates as is.
    """
    out = {}
    for task in tasks:
        built = (samples or {}).get(task) or build_samples(
            task, tokenizer, lengths=lengths, depths=depths, samples_per_cell=samples_per_cell,
            essay_words=essay_words, max_new_tokens=max_new_tokens, seed=seed)
        grid = np.zeros((len(lengths), len(depths)))
        examples = []
        for li, length in enumerate(lengths):
            cell = built[li]
            try:
                answers = generate_fn([tokenizer.encode(s.prompt) for s in cell],
                                      max_new_tokens)
            except Exception as e:  # noqa: BLE001 - only the out-of-memory error is wrapped
                if checkpoint_lib.is_out_of_memory(e):
                    raise OutOfMemory(task, length, e) from e
                raise
            for k, (s, a) in enumerate(zip(cell, answers)):
                text = tokenizer.decode(a)
                grid[li, k // samples_per_cell] += (string_match_all(text, [s.value])
                                                    / samples_per_cell)
                if len(examples) < 3:
                    examples.append({"length": length, "depth": s.depth, "value": s.value,
                                     "answer": text})
        out[task] = {"grid": grid.tolist(), "lengths": list(lengths), "depths": list(depths),
                     "mean": float(grid.mean()),
                     "per_length": {str(n): float(grid[i].mean()) for i, n in enumerate(lengths)},
                     "examples": examples}
    return out


def heatmap_png(result: dict, path: str, title: str) -> None:
    """Writes a length x depth heatmap of one task's grid (scores in [0, 1]) to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    grid = np.asarray(result["grid"])
    fig, ax = plt.subplots(figsize=(1.0 + 0.5 * grid.shape[1], 1.0 + 0.45 * grid.shape[0]))
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(grid.shape[1]), [f"{d:g}" for d in result["depths"]])
    ax.set_yticks(range(grid.shape[0]), [f"{n:,}" for n in result["lengths"]])
    ax.set_xlabel("needle depth (%)")
    ax.set_ylabel("context length (tokens)")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="string_match_all")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
