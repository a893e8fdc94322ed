"""experiments/generate_corpus.py: a tiny GGUF teacher end to end, and its flag errors."""

import os
import subprocess
import sys

import pytest
from absl.testing import absltest

from lattn_jax.data import shards
from lattn_jax.data.corpora import pieces
from tests.lattn_jax.halo import teacher_corpus_test

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.path.join(ROOT, "experiments", "generate_corpus.py")


class GenerateCorpusTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        self.gguf = teacher_corpus_test.write_tiny_gguf(os.path.join(self.root, "t.gguf"))
        self.topics = os.path.join(self.root, "topics.txt")
        with open(self.topics, "w", encoding="utf-8") as f:
            f.write("Volcano\nJazz\nNero\n")
        self.exclude = os.path.join(self.root, "exclude.txt")
        with open(self.exclude, "w", encoding="utf-8") as f:
            f.write("NERO\n")

    def command(self, *extra):
        return [sys.executable, BINARY, f"--model={self.gguf}", f"--topics={self.topics}",
                f"--exclude_topics={self.exclude}", "--template=Tell me about {topic}.",
                "--batch_size=2", "--prompt_len=160", "--max_new_tokens=6", "--min_tokens=1",
                "--samples_per_prompt=2", f"--output_dir={self.root}/gen", *extra]

    @pytest.mark.entry
    @pytest.mark.slow  # ~14 s on 2 cores: a process that imports jax (~5 s), then compiles
    def test_end_to_end_with_pieces(self):  # (the library's run: teacher_corpus_test.py, ~5 s)
        cmd = self.command(f"--pieces_dir={self.root}/p1", "--piece_mib=1")
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stdout, r"batch 2/2: .* tokens/s")
        self.assertRegex(result.stdout, r"complete: this run 24 tokens generated .* tokens/s")
        manifest = shards.read_manifest(f"{self.root}/gen")
        plan = manifest["generation"]["plan"]
        self.assertEqual(plan["chat"]["name"], "gguf")
        self.assertEqual(plan["topics"]["excluded"], 1)
        self.assertEqual(plan["model"]["file"], "t.gguf")
        self.assertEqual(plan["decontamination"]["sets"]["wiki.test.raw"]["items"], 62)
        self.assertEqual(manifest["generation"]["runs"][0]["backend"], "cpu")
        self.assertIn("--max_new_tokens=6", manifest["generation"]["runs"][0]["command"])
        docs = shards.open_corpus([f"{self.root}/gen"]).num_documents
        self.assertEqual(docs, manifest["totals"]["documents"])
        # The pieces hold this run's shards and the manifest, and join back into the directory.
        done = pieces.join_pieces(f"{self.root}/p1/gen.000000-000002.pieces.json",
                                  f"{self.root}/joined")
        self.assertEqual(done["files"], 7)  # 2 shards of 3 files, the manifest
        self.assertEqual(shards.open_corpus([f"{self.root}/joined/gen"]).num_documents, docs)

    def _check_errors(self, cases):
        running = {flag: subprocess.Popen(self.command(flag), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, cwd=ROOT)
                   for flag in cases}
        for flag, proc in running.items():
            _, err = proc.communicate(timeout=300)
            self.assertEqual(proc.returncode, 1, (flag, err))
            lines = [line for line in err.splitlines() if line.strip()]
            self.assertLen(lines, 1, (flag, err))
            self.assertRegex(lines[0], "^" + cases[flag], flag)
        self.assertFalse(os.path.exists(f"{self.root}/gen/{shards.MANIFEST}"))

    def test_bad_flags_give_one_line_naming_the_flag(self):
        self._check_errors({"--temperature=0": "error: --temperature must be a finite number > 0",
                            "--temperature=inf": "error: --temperature must be a finite number "
                                                 "> 0 .*, got inf$"})

    @pytest.mark.slow  # ~30 s on 2 cores: one process per flag, each importing jax (~5 s)
    def test_more_bad_flags(self):
        self._check_errors({
            "--chat_format=llama3": "error: --chat_format: expected one of auto, gguf, chatml, "
                                    "none, got 'llama3'",
            "--template=Write about it.": r"error: --template: 'Write about it\.' has no "
                                          r"\{topic\} placeholder",
            f"--topics={self.root}/none.txt": "error: --topics: no such file",
            "--max_tokens=0": "error: --max_tokens must be >= 1, got 0",
            "--decode_chunk=0": "error: --decode_chunk must be > 0",
            "--step=3": "error: --step applies to checkpoint directories",
        })


if __name__ == "__main__":
    absltest.main()
