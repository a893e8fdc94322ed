"""Test fixtures for the evaluators: a tiny GGUF model file and local lm-evaluation-harness tasks.

* :func:`write_tiny_gguf`: a random 2-layer Llama in a real GGUF file (fp32 tensors, a byte-level
  BPE tokenizer with a few merges, BOS and EOS), written with the ``gguf`` package of the
  ``test`` extra; ``restore.load_model`` and the harness adapter load it like any GGUF teacher.
* :func:`write_harness_tasks`: harness task YAML files (``piqa_local``, ``lambada_local``)
  whose prompts, targets and metrics are those of the harness's ``piqa`` and ``lambada_openai``
  tasks (lm-eval 0.4), over JSONL files written from a data directory laid out as
  ``shared/data`` (no hub access: the ``json`` dataset builder reads the local file).
* ``HARNESS_DATA``: that layout with the first 50 PIQA validation items and the first 20
  LAMBADA (OpenAI) test items, byte-for-byte the first lines of ``shared/data``'s files
  (``shared/data/SOURCES.md``: PIQA AFL-3.0, LAMBADA CC BY 4.0).
"""

import json
import os
from typing import Dict

import numpy as np

HARNESS_DATA = os.path.join(os.path.dirname(__file__), "testdata", "harness_data")

# The harness's piqa.yaml and lambada_openai.yaml (lm-eval 0.4.13) with local data files.
_TASK_YAML = {
    "piqa_local": """task: piqa_local
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {data}
  cache_dir: {cache}
output_type: multiple_choice
validation_split: validation
doc_to_text: "Question: {{{{goal}}}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "{{{{[sol1, sol2]}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
    "lambada_local": """task: lambada_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
output_type: loglikelihood
test_split: test
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
}


def write_harness_tasks(directory: str, data_dir: str = HARNESS_DATA) -> Dict[str, str]:
    """Writes ``piqa_local.yaml`` and ``lambada_local.yaml`` plus their JSONL data.

    Args:
      directory: where the files go (give it to the harness as ``--include_path``).
      data_dir: laid out as ``shared/data`` (``eval/piqa/valid.jsonl`` + ``valid-labels.lst``,
        ``eval/lambada/lambada_test.jsonl``).

    Returns:
      ``{task name: yaml path}``.
    """
    os.makedirs(directory, exist_ok=True)
    eval_dir = os.path.join(data_dir, "eval")
    with open(os.path.join(eval_dir, "piqa", "valid.jsonl"), encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(eval_dir, "piqa", "valid-labels.lst")) as f:
        labels = [int(x) for x in f.read().split()]
    piqa = os.path.join(directory, "piqa_local.jsonl")
    with open(piqa, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(dict(d, label=y)) + "\n" for d, y in zip(items, labels))
    data = {"piqa_local": piqa,
            "lambada_local": os.path.join(eval_dir, "lambada", "lambada_test.jsonl")}
    cache = os.path.join(directory, "hf_datasets_cache")
    paths = {}
    for name, template in _TASK_YAML.items():
        paths[name] = os.path.join(directory, f"{name}.yaml")
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write(template.format(data=data[name], cache=cache))
    return paths


# A byte-level BPE vocabulary: the 256 byte symbols, a few merges, BOS and EOS.
_MERGES = ("Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ s", "r e", "Ġ w")


def write_tiny_gguf(path: str, *, seed: int = 0, num_layers: int = 2) -> str:
    """Writes a random Llama (d 32, 4 heads of 8, 2 KV heads, MLP 64) as a GGUF file.

    Args:
      path: the ``.gguf`` file to write.
      seed: of the random weights (normal, std 0.2; norms around 1).
      num_layers: transformer blocks.

    Returns:
      ``path``.
    """
    import gguf
    from tokenizers import pre_tokenizers

    rng = np.random.default_rng(seed)
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens += ["".join(m.split(" ")) for m in _MERGES] + ["<|im_start|>", "<|endoftext|>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    vocab, d, heads, kv_heads, head_dim, hidden = len(tokens), 32, 4, 2, 8, 64

    def w(*shape, scale=0.2):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)

    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_context_length(2048)
    writer.add_embedding_length(d)
    writer.add_block_count(num_layers)
    writer.add_feed_forward_length(hidden)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(_MERGES))
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(vocab - 1)
    writer.add_tensor("token_embd.weight", w(vocab, d, scale=1.0))
    for i in range(num_layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", norm())
        writer.add_tensor(p + "attn_q.weight", w(heads * head_dim, d))
        writer.add_tensor(p + "attn_k.weight", w(kv_heads * head_dim, d))
        writer.add_tensor(p + "attn_v.weight", w(kv_heads * head_dim, d))
        writer.add_tensor(p + "attn_output.weight", w(d, heads * head_dim))
        writer.add_tensor(p + "ffn_norm.weight", norm())
        writer.add_tensor(p + "ffn_gate.weight", w(hidden, d))
        writer.add_tensor(p + "ffn_up.weight", w(hidden, d))
        writer.add_tensor(p + "ffn_down.weight", w(d, hidden))
    writer.add_tensor("output_norm.weight", norm())
    writer.add_tensor("output.weight", w(vocab, d))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
