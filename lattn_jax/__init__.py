"""lattn_jax: linear-attention language models in JAX/Flax.

Modules:

* ``config``: frozen, validated dataclasses for model, data, optimizer and training settings;
* ``layers``: RMSNorm, projections, SwiGLU, RoPE, short convolution;
* ``mixers``: one token mixer per variant, and the layer-pattern registry;
* ``model``: the language model built from a layer pattern;
* ``data``: tokenizers and the grain input pipeline;
* ``optim``: AdamW and learning-rate schedules;
* ``checkpoint``: orbax checkpointing of train state and data iterator;
* ``train``: ``train_and_evaluate(config, workdir)``.
"""

__version__ = "0.1.0"
