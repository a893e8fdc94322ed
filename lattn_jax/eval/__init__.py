"""Evaluation: generation with per-layer caches, zero-shot tasks, needle in a haystack, perplexity.

Modules:

* ``generate``: batched prefill + decode with KV caches and recurrent states, padding-safe,
  greedy / temperature / top-k / top-p sampling and stop tokens;
* ``scoring``: continuation log-likelihoods with lm-evaluation-harness semantics;
* ``tasks``: HellaSwag, PIQA, WinoGrande, ARC-Easy/Challenge, LAMBADA (OpenAI), OpenBookQA, BoolQ
  read from local files, with lm-eval prompts and metrics;
* ``niah``: RULER needle-in-a-haystack single-1/2/3 over a length x depth grid;
* ``perplexity``: sliding-window perplexity of held-out text;
* ``restore``: a model and tokenizer from a training workdir, a Hugging Face directory or a GGUF
  file (``load_model``);
* ``runner``: all of the above to JSON + markdown;
* ``driver``: one ``experiments/evaluate.py`` invocation (its checks, the restore, the run);
* ``lm_eval_adapter``: the ``lattn_jax`` model of lm-evaluation-harness (needs the ``lmeval``
  extra; imported on demand, not here).
"""
