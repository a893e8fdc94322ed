"""lattn_jax.halo.teacher_corpus: a tiny GGUF teacher sampled into token shards.

The shards must hold exactly what the Generator gives for the same batches and seeds, and a run
interrupted mid-way must resume to the same shards.
"""

import os

import gguf
import numpy as np
import pytest
from absl.testing import absltest

from lattn_jax import train
from lattn_jax.data import generated
from lattn_jax.data import shards
from lattn_jax.eval import generate as gen_lib
from lattn_jax.halo import teacher_corpus
from tests.lattn_jax import train_test

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _byte_level_alphabet():
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tiny_gguf(path, seed=0, *, d=32, layers=2, heads=4, kv_heads=2, head_dim=8, mlp=48):
    """A random 2-layer Llama GGUF with a byte-level BPE vocabulary (3 ChatML specials, the
    256 bytes, one merge) and SmolLM2's chat template. Returns ``path``."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _byte_level_alphabet() + ["er"]
    types = [3, 3, 3] + [1] * 257
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_block_count(layers)
    w.add_embedding_length(d)
    w.add_feed_forward_length(mlp)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_rope_freq_base(1e4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["e r"])
    w.add_eos_token_id(2)
    w.add_bos_token_id(1)
    w.add_chat_template(SMOLLM2_CHAT_TEMPLATE)

    def tensor(name, *shape, scale=0.2):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    tensor("token_embd.weight", len(tokens), d, scale=1.0)
    tensor("output_norm.weight", d)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", d)
        tensor(f"blk.{i}.ffn_norm.weight", d)
        tensor(f"blk.{i}.attn_q.weight", heads * head_dim, d)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, d)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, d)
        tensor(f"blk.{i}.attn_output.weight", d, heads * head_dim)
        tensor(f"blk.{i}.ffn_gate.weight", mlp, d)
        tensor(f"blk.{i}.ffn_up.weight", mlp, d)
        tensor(f"blk.{i}.ffn_down.weight", d, mlp)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class Interrupted(Exception):
    """Raised by a test's generate function to stop a run mid-way."""


class TeacherCorpusTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir = absltest.get_default_test_tmpdir()
        cls.gguf = write_tiny_gguf(os.path.join(cls.dir, "tiny-teacher.gguf"))
        cls.loaded = teacher_corpus.load_model(cls.gguf, dtype="float32")
        cls.chat = generated.ChatFormat.make("auto", cls.loaded.chat_template)
        cls.stop = generated.stop_token_ids(cls.loaded.tokenizer, cls.chat)
        # One options set for the whole class: 3 topics x 1 template x 2 samples = 6 rows in
        # batches of 4 (the second half-filled); one Sampler, so the programs compile once.
        cls.options = generated.GenerationOptions(
            templates=("Tell me about {topic}.",), samples_per_prompt=2, batch_size=4,
            prompt_len=160, max_new_tokens=12, min_tokens=1, temperature=1.0, top_p=0.9)
        cls.sampler = teacher_corpus.Sampler(
            cls.loaded.model, pad_id=cls.loaded.tokenizer.eos_id, **cls.options.sampling(),
            stop_tokens=cls.stop, decode_chunk=4)
        topics = os.path.join(cls.dir, "topics.txt")
        with open(topics, "w", encoding="utf-8") as f:
            f.write("Volcano\nJazz\nPhotosynthesis\n")
        cls.topics = generated.load_topics(topics)

    def generate(self, out, fn=None, **kw):
        return generated.generate_corpus(
            fn or self.sampler, self.loaded.tokenizer, self.topics, out, options=self.options,
            chat=self.chat, model=self.loaded.info, print_fn=lambda line: None, **kw)

    def test_loaded_gguf(self):
        info = self.loaded.info
        self.assertEqual((info["kind"], info["file"], info["dtype"], info["vocab_size"]),
                         ("gguf", "tiny-teacher.gguf", "float32", 260))
        self.assertEqual(info["sha256"], self.loaded.tokenizer.sha256)
        self.assertEqual(self.chat.name, "gguf")
        self.assertEqual(self.stop, [0, 1, 2])  # <|endoftext|>, <|im_start|>, <|im_end|> (EOS)

    def test_shards_equal_the_generators_outputs_and_resume(self):
        out = os.path.join(self.create_tempdir().full_path, "gen")
        result = self.generate(out)
        self.assertEqual((result["status"], result["new_batches"]), ("complete", [0, 1]))
        manifest = shards.read_manifest(out)
        self.assertEqual(manifest["generation"]["plan"]["model"]["sha256"],
                         self.loaded.tokenizer.sha256)
        corpus = shards.open_corpus([out])

        # The same batches through the Generator directly: the chat-wrapped prompts of the
        # plan's items, left-padded to prompt_len, sampled with each batch's seed.
        tok, p = self.loaded.tokenizer, self.options.prompt_len
        prompts, _ = generated.build_prompts(self.topics.topics, self.options.templates,
                                             self.chat, tok, p)
        items = generated.plan_items(list(prompts), 2, self.options.seed)
        generator = self.sampler.generator  # a Generator; its programs are compiled already
        self.assertIsInstance(generator, gen_lib.Generator)
        sampling = gen_lib.SamplingConfig(temperature=1.0, top_p=0.9)
        expected, expected_items = [], []
        for b in range(2):
            batch = items[4 * b:4 * b + 4]
            rows = [prompts[i[:2]] for i in batch] + [prompts[batch[0][:2]]] * (4 - len(batch))
            tokens = np.full((4, p), tok.eos_id, np.int32)
            mask = np.zeros((4, p), bool)
            for r, ids in enumerate(rows):
                tokens[r, p - len(ids):], mask[r, p - len(ids):] = ids, True
            gen = generator.generate_padded(tokens, mask, max_new_tokens=12, sampling=sampling,
                                            stop_tokens=self.stop,
                                            seed=generated.batch_seed(0, b))
            for item, ids, done in list(zip(batch, gen.tokens, gen.finished)):
                expected.append(ids[:-1] if done else ids)
                expected_items.append(list(item))
        self.assertEqual([corpus.document(i).tolist() for i in range(corpus.num_documents)],
                         expected)
        self.assertEqual([i for e in manifest["shards"]
                          for i in generated.read_prompts(out, e).tolist()], expected_items)
        self.assertEqual(corpus.num_documents, 6)

        # Interrupted after the first batch, then run again: the same shards.
        cut = os.path.join(self.create_tempdir().full_path, "gen")
        calls = []

        def interrupted(tokens, mask, seed):
            calls.append(seed)
            if len(calls) == 2:
                raise Interrupted()
            return self.sampler(tokens, mask, seed)

        with self.assertRaises(Interrupted):
            self.generate(cut, fn=interrupted)
        self.assertEqual([e["batch"] for e in shards.read_manifest(cut)["shards"]], [0])
        self.assertEqual(self.generate(cut)["new_batches"], [1])
        for e in manifest["shards"]:
            for key in ("token_file", "offsets_file", "prompts_file"):
                with open(os.path.join(out, e[key]), "rb") as a, \
                        open(os.path.join(cut, e[key]), "rb") as b:
                    self.assertEqual(a.read(), b.read(), e[key])
        self.assertEqual(shards.read_manifest(cut)["totals"], manifest["totals"])

    def test_load_errors_name_the_flag(self):
        with self.assertRaisesRegex(FileNotFoundError, "--model: no such GGUF file or "
                                                       "checkpoint directory"):
            teacher_corpus.load_model(os.path.join(self.dir, "none.gguf"))
        with self.assertRaisesRegex(ValueError, "--step applies to checkpoint directories"):
            teacher_corpus.load_model(self.gguf, step=3)
        with self.assertRaisesRegex(ValueError, "--dtype: expected one of auto, bfloat16, "
                                                "float32"):
            teacher_corpus.load_model(self.gguf, dtype="float16")
        self.assertEqual(teacher_corpus.resolve_dtype("auto"), "float32")  # CPU


class CheckpointTest(train_test.CorpusTestCase):

    @pytest.mark.slow  # about a minute on 2 cores: trains a tiny hybrid 2 steps, samples it
    def test_a_training_workdir_is_a_teacher(self):
        workdir = os.path.join(self.tmp, "run")
        train.train_and_evaluate(
            train_test.tiny_experiment(self.corpus, total_steps=2, eval_every=2,
                                       checkpoint_every=2, log_every=1), workdir)
        loaded = teacher_corpus.load_model(workdir, dtype="float32")
        info = loaded.info
        self.assertEqual((info["kind"], info["file"], info["step"], info["layers"]),
                         ("checkpoint", "run", 2, ["gdn", "attn"]))
        self.assertLen(info["sha256"], 64)
        self.assertIsNone(loaded.chat_template)
        chat = generated.ChatFormat.make("auto", loaded.chat_template)
        options = generated.GenerationOptions(templates=("{topic} is",), batch_size=2,
                                              prompt_len=16, max_new_tokens=5, min_tokens=1)
        sampler = teacher_corpus.Sampler(
            loaded.model, pad_id=loaded.tokenizer.eos_id, **options.sampling(),
            stop_tokens=generated.stop_token_ids(loaded.tokenizer, chat))
        path = os.path.join(self.tmp, "topics.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("The sea\nA river\n")
        out = os.path.join(self.tmp, "gen")
        generated.generate_corpus(sampler, loaded.tokenizer, generated.load_topics(path), out,
                                  options=options, chat=chat, model=info,
                                  print_fn=lambda line: None)
        manifest = shards.read_manifest(out)
        self.assertEqual(manifest["tokenizer"]["name"], "byte")
        self.assertEqual(manifest["generation"]["counts"]["rows"], 2)


if __name__ == "__main__":
    absltest.main()
