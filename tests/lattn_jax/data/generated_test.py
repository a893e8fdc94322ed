"""lattn_jax.data.generated: the plan, filters, manifest, budgets and resume (scripted model).

The model is a scripted ``GenerateFn`` over the byte tokenizer: each row's output is decided by
its prompt's topic and the batch seed, so every filter can be hit on purpose. The real
Generator behind the same loop is tested in ``tests/lattn_jax/halo/teacher_corpus_test.py``.
"""

import json
import random
import os
import time

import numpy as np
from absl.testing import absltest

from lattn_jax import data as data_lib
from lattn_jax.data import generated
from lattn_jax.data import shards
from lattn_jax.data import tokenizers
from lattn_jax.data.corpora import pieces

TOK = tokenizers.ByteTokenizer()
EOS = TOK.eos_id
# 13 words of a (made-up) evaluation item; a document holding them is contaminated.
EVAL_ITEM = ("the quick brown fox jumps over the lazy dog while seven tired otters sing "
             "loudly near the river bank")
PLANTED = "Intro paragraph.\n\nIt says the quick brown fox jumps over the lazy dog while seven " \
          "tired otters sing loudly, and more."
TEMPLATE = "About {topic}:"


def scripted(calls=None, fail_at=None):
    """A GenerateFn: the row's text depends on the topic in its prompt and the seed."""
    def fn(tokens, mask, seed):
        if calls is not None:
            calls.append((tokens.copy(), mask.copy(), seed))
        if fail_at is not None and len(calls) > fail_at:
            raise RuntimeError("interrupted")
        rows, finished = [], []
        for row, m in zip(tokens, mask):
            topic = TOK.decode(row[m].tolist())[len("About "):-1]
            if topic == "short":
                ids, done = TOK.encode("tiny"), True
            elif topic == "contaminated":
                ids, done = TOK.encode(PLANTED), True
            elif topic == "rambling":
                ids, done = TOK.encode("x" * 40), False  # hits max_new_tokens, no stop token
            else:
                ids, done = TOK.encode(f"{topic} is a topic; seed {seed}."), True
            rows.append(ids + ([EOS] if done else []))
            finished.append(done)
        return rows, finished
    return fn


class GeneratedTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        self.eval_dir = os.path.join(self.root, "eval", "toyset")
        os.makedirs(self.eval_dir)
        with open(os.path.join(self.eval_dir, "valid.jsonl"), "w") as f:
            f.write(json.dumps({"question": EVAL_ITEM}) + "\n")

    def topics(self, names, exclude=None):
        path = os.path.join(self.root, "topics.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(names) + "\n")
        exclude_path = None
        if exclude is not None:
            exclude_path = os.path.join(self.root, "exclude.txt")
            with open(exclude_path, "w", encoding="utf-8") as f:
                f.write("\n".join(exclude) + "\n")
        return generated.load_topics(path, exclude_path)

    def run_plan(self, out, topics, fn=None, decon=None, **kw):
        options = kw.pop("options", None) or generated.GenerationOptions(
            templates=(TEMPLATE,), batch_size=3, prompt_len=32, max_new_tokens=40, min_tokens=8)
        return generated.generate_corpus(
            fn or scripted(), TOK, topics, out, options=options,
            chat=generated.ChatFormat.make("none"), model={"kind": "scripted"},
            decontaminator=decon, print_fn=lambda line: None, **kw)

    def test_topics_file_dedup_blank_and_exclude(self):
        topics = self.topics(["Volcano", "", "  Jazz ", "volcano", "Nero", "Photosynthesis"],
                             exclude=["NERO", "jazz", "not a topic"])
        self.assertEqual(topics.topics, ["Volcano", "Photosynthesis"])
        self.assertEqual({k: topics.info[k] for k in ("lines", "blank", "duplicates", "excluded",
                                                      "exclude_entries", "topics")},
                         {"lines": 6, "blank": 1, "duplicates": 1, "excluded": 2,
                          "exclude_entries": 3, "topics": 2})

    def test_excluded_topics_are_never_prompted(self):
        calls = []
        topics = self.topics(["Volcano", "Nero", "Jazz"], exclude=["nero"])
        self.run_plan(os.path.join(self.root, "out"), topics, fn=scripted(calls))
        prompted = {TOK.decode(row[m].tolist()) for tokens, mask, _ in calls
                    for row, m in zip(tokens, mask)}
        self.assertEqual(prompted, {"About Volcano:", "About Jazz:"})

    def test_plan_covers_every_prompt_once_per_sample(self):
        pairs = [(t, k) for t in range(5) for k in range(2)]
        items = generated.plan_items(pairs, 3, seed=7)
        self.assertLen(items, 30)
        for s in range(3):  # sample s of every prompt before sample s + 1, in one order
            block = items[s * 10:(s + 1) * 10]
            self.assertEqual(sorted(i[:2] for i in block), pairs)
            self.assertEqual({i[2] for i in block}, {s})
            self.assertEqual([i[:2] for i in block], [i[:2] for i in items[:10]])
        self.assertNotEqual([i[:2] for i in items[:10]], pairs)  # shuffled
        self.assertEqual(items, generated.plan_items(pairs[::-1], 3, seed=7))
        self.assertNotEqual(generated.batch_seed(0, 0), generated.batch_seed(0, 1))

    def test_filters_counts_and_documents(self):
        out = os.path.join(self.root, "out")
        topics = self.topics(["Volcano", "short", "contaminated", "rambling", "Jazz"])
        decon = generated.Decontaminator([os.path.join(self.root, "eval")])
        result = self.run_plan(out, topics, decon=decon)
        self.assertEqual(result["status"], "complete")
        manifest = shards.read_manifest(out)
        counts = manifest["generation"]["counts"]
        self.assertEqual({k: counts[k] for k in (
            "rows", "batches_done", "kept_documents", "dropped_short", "dropped_contaminated",
            "dropped_unfinished", "unfinished_kept", "finished_rows")},
            {"rows": 5, "batches_done": 2, "kept_documents": 3, "dropped_short": 1,
             "dropped_contaminated": 1, "dropped_unfinished": 0, "unfinished_kept": 1,
             "finished_rows": 4})
        self.assertEqual(counts["contaminated_by_set"], {"toyset": 1})
        self.assertEqual(manifest["generation"]["plan"]["decontamination"]["sets"],
                         {"toyset": {"items": 1, "uncheckable_items": 0}})
        # The documents: the continuation only, without the stop token, in batch order; each
        # shard lists the (topic, template, sample) of its documents.
        corpus = shards.open_corpus([out])
        texts = [TOK.decode(corpus.document(i).tolist()) for i in range(corpus.num_documents)]
        expected = []
        for entry in manifest["shards"]:
            self.assertEqual(entry["name"], "teacher")
            for topic, template, sample in generated.read_prompts(out, entry):
                name = topics.topics[topic]
                expected.append("x" * 40 if name == "rambling" else
                                f"{name} is a topic; seed {entry['batch_seed']}.")
        self.assertEqual(texts, expected)
        self.assertNotIn(EOS, np.concatenate([corpus.document(i) for i in range(3)]))
        self.assertEqual(corpus.shard_names, ["teacher", "teacher"])
        self.assertEqual(manifest["tokenizer"]["sha256"], TOK.sha256)

    def test_drop_unfinished_and_min_tokens(self):
        topics = self.topics(["Volcano", "rambling"])
        options = generated.GenerationOptions(templates=(TEMPLATE,), batch_size=4, prompt_len=32,
                                              max_new_tokens=40, min_tokens=50,
                                              drop_unfinished=True)
        self.run_plan(os.path.join(self.root, "out"), topics, options=options)
        counts = shards.read_manifest(os.path.join(self.root, "out"))["generation"]["counts"]
        # "Volcano is a topic; seed N." is under 50 bytes; the rambling row is unfinished.
        self.assertEqual((counts["kept_documents"], counts["dropped_short"],
                          counts["dropped_unfinished"]), (0, 1, 1))

    def test_resume_after_an_interruption_gives_the_same_shards(self):
        topics = self.topics([f"topic {i}" for i in range(7)])
        whole = os.path.join(self.root, "whole")
        self.run_plan(whole, topics)
        cut = os.path.join(self.root, "cut")
        calls = []
        with self.assertRaisesRegex(RuntimeError, "interrupted"):
            self.run_plan(cut, topics, fn=scripted(calls, fail_at=2))
        self.assertEqual(shards.read_manifest(cut)["generation"]["counts"]["batches_done"], 2)
        calls = []
        result = self.run_plan(cut, topics, fn=scripted(calls))
        self.assertLen(calls, 1)  # only the third batch ran again
        self.assertEqual(result["new_batches"], [2])
        self.assertSameShards(whole, cut)
        self.assertLen(shards.read_manifest(cut)["generation"]["runs"], 2)

    def assertSameShards(self, a, b):
        ma, mb = shards.read_manifest(a), shards.read_manifest(b)
        strip = [{k: v for k, v in e.items() if k != "seconds"} for e in ma["shards"]]
        self.assertEqual(strip, [{k: v for k, v in e.items() if k != "seconds"}
                                 for e in mb["shards"]])
        self.assertEqual(ma["totals"], mb["totals"])
        for e in ma["shards"]:
            for key in ("token_file", "offsets_file", "prompts_file"):
                with open(os.path.join(a, e[key]), "rb") as fa, \
                        open(os.path.join(b, e[key]), "rb") as fb:
                    self.assertEqual(fa.read(), fb.read(), e[key])

    def test_budgets_deadline_and_continuing(self):
        topics = self.topics([f"topic {i}" for i in range(7)])
        out = os.path.join(self.root, "out")
        result = self.run_plan(out, topics, max_documents=4)
        self.assertEqual((result["status"], result["new_batches"]), ("budget", [0, 1]))
        result = self.run_plan(out, topics, deadline=time.time() - 1)
        self.assertEqual((result["status"], result["new_batches"]), ("deadline", []))
        result = self.run_plan(out, topics, max_tokens=10 ** 6)
        self.assertEqual((result["status"], result["new_batches"]), ("complete", [2]))
        self.assertSameShards(out, self._whole(topics))

    def _whole(self, topics):
        whole = os.path.join(self.root, "whole")
        self.run_plan(whole, topics)
        return whole

    def test_calls_on_fresh_machines_join_into_the_whole_directory(self):
        topics = self.topics([f"topic {i}" for i in range(7)])
        first, second = (os.path.join(self.root, d, "gen") for d in ("m1", "m2"))
        one = self.run_plan(first, topics, max_documents=1)
        generated.pack_new_shards(first, one["new_files"], os.path.join(self.root, "p1"),
                                  new_batches=one["new_batches"], piece_bytes=1 << 20)
        # A fresh machine: an empty directory and the first call's manifest.
        two = self.run_plan(second, topics,
                            resume_manifest=os.path.join(first, shards.MANIFEST))
        self.assertEqual(two["new_batches"], [1, 2])
        # Later runs there need not be given the manifest again.
        self.assertEqual(self.run_plan(second, topics)["new_batches"], [])
        self.assertEqual(shards.read_manifest(second)["generation"]["batches_elsewhere"],
                         [[0, 1]])
        packed = generated.pack_new_shards(second, two["new_files"],
                                           os.path.join(self.root, "p2"),
                                           new_batches=two["new_batches"], piece_bytes=1 << 20)
        self.assertEqual(packed["archive"], "gen.000001-000003.tar.xz")
        self.assertNotIn("teacher-000000.tokens.bin", packed["files"])
        joined = os.path.join(self.root, "joined")
        pieces.join_pieces(os.path.join(self.root, "p1", "gen.000000-000001.pieces.json"),
                           joined)
        pieces.join_pieces(os.path.join(self.root, "p2", "gen.000001-000003.pieces.json"),
                           joined)
        self.assertSameShards(os.path.join(joined, "gen"), self._whole(topics))
        self.assertEqual(shards.open_corpus([os.path.join(joined, "gen")]).num_documents, 7)

    def test_the_pipeline_reads_it_with_eos_and_source_weights(self):
        topics = self.topics([f"topic {i}" for i in range(7)])
        out = os.path.join(self.root, "out")
        self.run_plan(out, topics)
        config = data_lib.DataConfig(paths=(out,), format="tokens", tokenizer="byte",
                                     seq_len=16, batch_size=2, val_fraction=0.3,
                                     shuffle=False, source_weights={"teacher": 2.0})
        ds = data_lib.build_datasets(config)
        corpus = shards.open_corpus([out])
        train_docs = corpus.num_documents - ds.stats.val_documents
        self.assertEqual(ds.stats.train_documents, 2 * train_docs)  # every shard is "teacher"
        # Each document is followed by the EOS the pipeline appends (none is stored).
        val = np.concatenate([b["inputs"][r] for b in ds.val_batches
                              for r in range(len(b["inputs"])) if b["weights"][r].any()])
        ends = np.flatnonzero(val[:-1] == EOS)
        ends = ends[ends > 0]
        self.assertNotEmpty(ends)
        self.assertEqual(set(TOK.decode(val[ends - 1].tolist())), {"."})  # "...seed N." EOS
        self.assertEqual(set(TOK.decode(val[ends + 1].tolist())), {"t"})  # EOS "topic ..."

    def test_another_plan_is_refused_naming_the_fields(self):
        topics = self.topics(["Volcano", "Jazz"])
        out = os.path.join(self.root, "out")
        self.run_plan(out, topics, max_documents=1)
        options = generated.GenerationOptions(templates=(TEMPLATE,), batch_size=3, prompt_len=32,
                                              max_new_tokens=40, min_tokens=8, temperature=0.7)
        with self.assertRaisesRegex(ValueError, r"another plan \(it differs in: sampling\).*"
                                                r"--output_dir"):
            self.run_plan(out, topics, options=options)
        with self.assertRaisesRegex(ValueError, "differs in: topics, topics_sha256"):
            self.run_plan(out, self.topics(["Volcano", "Jazz", "Nero"]))

    def test_bad_values_name_their_flag(self):
        cases = [
            (dict(temperature=0.0), "--temperature must be a finite number > 0"),
            # inf was accepted: uniform sampling over the vocabulary, noise as a corpus.
            (dict(temperature=float("inf")), r"--temperature must be a finite number > 0 .*, "
                                             r"got inf$"),
            (dict(temperature=float("nan")), "--temperature must be a finite number > 0"),
            (dict(temperature=-random.uniform(0.1, 2.0)), "--temperature must be a finite"),
            (dict(temperature=-float("inf")), "--temperature must be a finite number > 0"),
            (dict(temperature="0.8"), r"--temperature must be a finite number > 0 .*, got "
                                      r"'0\.8'$"),
            (dict(top_p=1.5), r"--top_p must be in \(0, 1\]"),
            (dict(batch_size=0), "--batch_size must be an integer >= 1"),
            (dict(min_tokens=0), "--min_tokens must be"),
            (dict(samples_per_prompt=0), "--samples_per_prompt"),
            (dict(templates=("Write about it.",)), r"--template: 'Write about it\.' has no "
                                                   r"\{topic\}"),
            (dict(templates=()), "--template: give at least one"),
            (dict(source_name="a b"), "--source_name"),
        ]
        for kwargs, message in cases:
            with self.assertRaisesRegex(ValueError, message):
                generated.GenerationOptions(**kwargs)
        with self.assertRaisesRegex(ValueError, "--chat_format: expected one of"):
            generated.ChatFormat.make("llama3")
        with self.assertRaisesRegex(ValueError, "--chat_format=gguf: the model file has no"):
            generated.ChatFormat.make("gguf", None)
        with self.assertRaisesRegex(FileNotFoundError, "--topics: no such file"):
            generated.load_topics(os.path.join(self.root, "none.txt"))
        bad = os.path.join(self.root, "latin1.txt")
        with open(bad, "wb") as f:
            f.write(b"Caf\xe9\n")
        with self.assertRaisesRegex(ValueError, "--topics: .* is not UTF-8"):
            generated.load_topics(bad)
        with self.assertRaisesRegex(ValueError, "--max_tokens must be >= 1"):
            self.run_plan(os.path.join(self.root, "o"), self.topics(["a"]), max_tokens=0)
        with self.assertRaisesRegex(ValueError, "--prompt_len: every prompt is longer"):
            self.run_plan(os.path.join(self.root, "o"), self.topics(["a"]),
                          options=generated.GenerationOptions(templates=(TEMPLATE,),
                                                              prompt_len=4))


class ChatFormatTest(absltest.TestCase):

    SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != "
               "'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM,"
               " trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
               "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
               "{% endif %}")

    def test_the_gguf_template_chatml_and_none(self):
        gguf = generated.ChatFormat.make("auto", self.SMOLLM2)
        self.assertEqual(gguf.name, "gguf")
        self.assertEqual(gguf.render("Explain tides."),
                         "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                         "trained by Hugging Face<|im_end|>\n<|im_start|>user\nExplain tides."
                         "<|im_end|>\n<|im_start|>assistant\n")
        own = generated.ChatFormat.make("gguf", self.SMOLLM2, system_prompt="Be brief.")
        self.assertTrue(own.render("x").startswith("<|im_start|>system\nBe brief.<|im_end|>"))
        self.assertEqual(generated.ChatFormat.make("chatml").render("Explain tides."),
                         "<|im_start|>user\nExplain tides.<|im_end|>\n<|im_start|>assistant\n")
        self.assertEqual(generated.ChatFormat.make("auto").name, "none")
        self.assertEqual(generated.ChatFormat.make("none").render("Explain tides."),
                         "Explain tides.")
        # Markers that are not single tokens (the byte tokenizer) do not stop a row.
        self.assertEqual(generated.stop_token_ids(TOK, gguf), [EOS])


if __name__ == "__main__":
    absltest.main()
