"""lattn_jax.halo.corpus_driver in-process: option checks, a deadline stop and the resume.

The binary end to end: ``tests/experiments/generate_corpus_test.py``.
"""

import os

from absl.testing import absltest

from lattn_jax.data import shards
from lattn_jax.halo import corpus_driver
from tests.lattn_jax.halo import teacher_corpus_test


class CheckOptionsTest(absltest.TestCase):

    def test_bad_options_name_the_flag(self):
        for kw, message in (
                (dict(decode_chunk=0), r"^--decode_chunk must be > 0, got 0$"),
                (dict(piece_mib=-1), r"^--piece_mib must be > 0, got -1$"),
                (dict(deadline_s=0.0), r"^--deadline_s must be > 0, got 0.0$"),
                (dict(temperature=0.0), r"^--temperature must be a finite number > 0"),
                (dict(temperature=float("inf")),
                 r"^--temperature must be a finite number > 0 .*, got inf$"),
                (dict(templates=["no topic"]), r"^--template: 'no topic' has no \{topic\}"),
                (dict(chat_format="llama3"), r"^--chat_format: expected one of auto, gguf, "
                                             r"chatml, none, got 'llama3'$")):
            request = corpus_driver.GenerateRequest(model="m.gguf", output_dir="out", **kw)
            with self.assertRaisesRegex(ValueError, message, msg=str(kw)):
                corpus_driver.check_options(request)

    def test_the_generation_options(self):
        options = corpus_driver.check_options(corpus_driver.GenerateRequest(
            model="m.gguf", output_dir="out", templates=["About {topic}."], batch_size=2,
            top_k=5))
        self.assertEqual((options.templates, options.batch_size, options.top_k),
                         (("About {topic}.",), 2, 5))


class RunTest(absltest.TestCase):

    def test_a_deadline_stop_then_the_same_request_completes(self):
        root = self.create_tempdir().full_path
        gguf = teacher_corpus_test.write_tiny_gguf(os.path.join(root, "t.gguf"))
        topics = os.path.join(root, "topics.txt")
        with open(topics, "w", encoding="utf-8") as f:
            f.write("Volcano\nJazz\n")
        kw = dict(model=gguf, output_dir=os.path.join(root, "gen"), topics=topics,
                  templates=["Tell me about {topic}."], batch_size=2, prompt_len=160,
                  max_new_tokens=4, min_tokens=1, samples_per_prompt=2, decode_chunk=4,
                  decontaminate=False)
        lines = []
        request = corpus_driver.GenerateRequest(deadline_s=1e-9, **kw)
        status = corpus_driver.run(request, argv=["generate_corpus.py", "--x=1"],
                                   print_fn=lines.append)
        self.assertEqual(status, corpus_driver.EXIT_DEADLINE)
        self.assertRegex(lines[-1], rf"^deadline: this run 0 tokens generated .*; "
                         rf"{kw['output_dir']}: 0/2 batches")
        lines.clear()
        request = corpus_driver.GenerateRequest(pieces_dir=os.path.join(root, "p"), **kw)
        self.assertEqual(corpus_driver.run(request, argv=["g.py"], print_fn=lines.append), 0)
        self.assertRegex(lines[-2], r"^pieces: 1 of .* MiB in .*/p \(.*; join in run order\)$")
        self.assertRegex(lines[-1], r"^complete: .*: 2/2 batches")
        runs = shards.read_manifest(kw["output_dir"])["generation"]["runs"]
        self.assertEqual([r["command"] for r in runs], ["generate_corpus.py --x=1", "g.py"])


if __name__ == "__main__":
    absltest.main()
