"""Generates text from a trained checkpoint with per-layer caches (prefill, then decode).

Usage::

    python experiments/generate.py --checkpoint=runs/default --prompt="The history of" \\
        --prompt="In 1990 ," --max_new_tokens=40 --temperature=0.8 --top_p=0.9

``--checkpoint`` is a training workdir (``--step``: one of its checkpoints), a HALO workdir (its
converted student), a Hugging Face checkpoint directory or a GGUF file (e.g. HALO's teacher), as
for ``evaluate.py`` (:func:`lattn_jax.eval.restore.load_model`).

Prompts of different lengths are batched with left padding; padding never enters any layer's
state (``lattn_jax/eval/generate.py``). Greedy unless ``--temperature > 0``; a row stops at EOS
or at ``--stop_token`` ids. ``--context=N`` splits the prefill of each prompt over N devices
(context parallelism; prompts are padded to a multiple of N long enough that every device's
shard holds the short convolution's halo: ``context_parallel.padding_bucket``).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import context_parallel  # noqa: E402
from lattn_jax import sharding  # noqa: E402
from lattn_jax.eval import generate as gen_lib  # noqa: E402
from lattn_jax.eval import restore  # noqa: E402

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Training workdir, HALO workdir, Hugging "
                                  "Face directory or GGUF file.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest).")
_PROMPTS = flags.DEFINE_multi_string("prompt", None, "A prompt (repeat for a batch).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate per prompt.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens (0 = all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1 = all).")
_STOP = flags.DEFINE_list("stop_token", [], "Extra stop token ids (EOS always stops).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_CONTEXT = flags.DEFINE_integer("context", 1, "Split the prompts' prefill over this many devices "
                                "(context parallelism); the other devices split the batch.")
flags.mark_flags_as_required(["checkpoint", "prompt"])


def main(argv):
    config_lib.reject_arguments(argv)  # one line, not the help text
    logging.set_verbosity(logging.WARNING)
    try:
        stop = [int(s) for s in _STOP.value]
    except ValueError:
        sys.exit(f"error: --stop_token={','.join(_STOP.value)}: token ids are integers")
    try:
        sampling = gen_lib.SamplingConfig(temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                                          top_p=_TOP_P.value)
        if _MAX_NEW.value < 1:  # Generator.generate checks it too, but after the model loads
            raise ValueError(f"max_new_tokens must be >= 1, got {_MAX_NEW.value}")
        context_parallel.check_context(_CONTEXT.value)  # before the model is loaded
        empty = [n for n, p in enumerate(_PROMPTS.value, 1) if not p]  # the flag's occurrences
        if empty:  # Generator.generate's error counted the prompts from 0, after the load
            raise ValueError(f"--prompt #{empty[0]} is empty; give it at least one token")
        # A training or HALO workdir, a Hugging Face directory or a GGUF file.
        restored = restore.load_model(_CHECKPOINT.value, _STEP.value)
        tok = restored.tokenizer
        vocab = restored.model_config.vocab_size
        outside = [s for s in stop if not 0 <= s < vocab]
        if outside:
            raise ValueError(f"--stop_token: {outside} outside the model's vocabulary "
                             f"[0, {vocab})")
        mesh = context_parallel.evaluation_mesh(_CONTEXT.value)
        bucket = context_parallel.padding_bucket(16, _CONTEXT.value, restored.model_config)
        generator = gen_lib.Generator(context_parallel.replicate(restored.model, mesh),
                                      pad_id=tok.eos_id, bucket=bucket)
        prompt_ids = [tok.encode(p) for p in _PROMPTS.value]
        with sharding.activate(mesh, config_lib.DEFAULT_AXIS_RULES):
            out = generator.generate(prompt_ids, max_new_tokens=_MAX_NEW.value,
                                     sampling=sampling, stop_tokens=[tok.eos_id] + stop,
                                     seed=_SEED.value)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    for prompt, p_ids, ids in zip(_PROMPTS.value, prompt_ids, out.tokens):
        print(f"{prompt}{gen_lib.continuation_text(tok, p_ids, ids)}")
        print("-" * 80)


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.parse_flags)
