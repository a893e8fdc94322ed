"""HALO: convert a pretrained Transformer into a HypeNet hybrid and distil it (arXiv 2601.22156).

Spec: ``hypenet-halo.md`` (facts from the authors' code). Modules:

* :mod:`loaders`: Hugging Face (Llama, Qwen3) and GGUF teachers into our parameters;
* :mod:`hypenet`: the HypeNet conversion (Lightning layers with HyPE, NoPE attention layers);
* :mod:`losses`: Stage-1 MSE, Stage-2 forward KL, Stage-3 cross-entropy;
* :mod:`selection`: the attention-layer selection score and its evaluations;
* :mod:`stages`: the training loops of Stages 1-3 and the calibration of ``a``;
* :mod:`pipeline`: the stages in order, resumable under a deadline (``halo_pipeline.py``);
* :mod:`corpus_driver`: teacher-generated text as token shards (``generate_corpus.py``).
"""
