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
    What is the special magic {number|uuid} for {key} mentioned in the provided text? \
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

Scoring is lenient, RULER's ``string_match_all``: 1 if the needle value occurs in the generated
text (case-insensitive), else 0; generation is greedy.
"""

import dataclasses
import glob
import os
import random
import re
import uuid
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

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
        if essay_words is None:
            raise ValueError(f"{task} needs essay_words")
        words = [essay_words[i % len(essay_words)] for i in range(haystack_units)]
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
      ValueError: if even an empty haystack does not fit in ``length``.
    """
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

    def build(n):
        s = build_prompt(task, n, depth, key, value, essay_words, distractors)
        return s, len(tokenizer.encode(s.prompt))

    budget = length - max_new_tokens
    lo_sample, lo_tokens = build(0)
    if lo_tokens > budget:
        raise ValueError(f"{task}: the prompt without haystack has {lo_tokens} tokens, more than "
                         f"length {length} minus {max_new_tokens} answer tokens")
    lo, hi = 0, 1
    if start_units is not None and start_units > 0:
        # Gallop from the guess: lo fits, hi does not.
        step = max(1, start_units // 2048)
        if build(start_units)[1] <= budget:
            lo, hi = start_units, start_units + step
            while build(hi)[1] <= budget:
                lo, hi, step = hi, hi + step, step * 2
        else:
            hi, lo = start_units, max(0, start_units - step)
            while lo > 0 and build(lo)[1] > budget:
                hi, lo, step = lo, max(0, lo - step), step * 2
    else:
        while build(hi)[1] <= budget:  # grow until it no longer fits
            lo, hi = hi, hi * 2
    while hi - lo > 1:  # the largest haystack that fits lies in [lo, hi)
        mid = (lo + hi) // 2
        if build(mid)[1] <= budget:
            lo = mid
        else:
            hi = mid
    sample, n_tokens = build(lo)
    return dataclasses.replace(sample, length=length, num_tokens=n_tokens)


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER's score: the fraction of ``references`` contained in ``prediction`` (case-folded)."""
    return sum(r.lower() in prediction.lower() for r in references) / len(references)


def run(generate_fn, tokenizer: tok_lib.Tokenizer, *, tasks: Sequence[str],
        lengths: Sequence[int], depths: Sequence[float], samples_per_cell: int = 1,
        essay_words: Optional[Sequence[str]] = None, max_new_tokens: int = 32,
        seed: int = 42) -> Dict[str, dict]:
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

    Returns:
      ``{task: {"grid": [len(lengths), len(depths)] scores, "lengths", "depths", "mean",
      "per_length": {length: mean}, "examples": [first few (prompt tail, answer, value)]}}``.

    Raises:
      ValueError: for an unknown task.
    """
    out = {}
    for task in tasks:
        if task not in ALL_TASKS:
            raise ValueError(f"unknown NIAH task {task!r}; choose from {', '.join(ALL_TASKS)}")
        rng = random.Random(seed)
        grid = np.zeros((len(lengths), len(depths)))
        examples = []
        for li, length in enumerate(lengths):
            samples = [make_sample(task, tokenizer, length, d, rng, essay_words, max_new_tokens)
                       for d in depths for _ in range(samples_per_cell)]
            answers = generate_fn([tokenizer.encode(s.prompt) for s in samples], max_new_tokens)
            for k, (s, a) in enumerate(zip(samples, answers)):
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
