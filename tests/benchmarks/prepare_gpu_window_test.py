"""benchmarks/prepare_gpu_window.sh: its steps' commands, skips, piece links and bad input.

The script rebuilds what a GPU window carries on a fresh machine; a mistake in it costs the
first half hour of a session. The corpus build and the pack are tested where they live
(tests/experiments/build_corpus_test.py, tests/benchmarks/halo_h200_test.py); here the script's
own logic runs on a fake pack and with ``DRY_RUN=1``.
"""

import os
import subprocess

from absl.testing import absltest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "benchmarks", "prepare_gpu_window.sh")


def run(args, **env):
    return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


class PrepareGpuWindowTest(absltest.TestCase):

    def test_the_carried_folders_are_in_gitignore(self):
        # exclude() writes .git/info/exclude only where .git is a directory: in a worktree
        # (.git a file) the pieces stayed untracked files, which travel with every call and
        # pass its 64 MiB (and BUILD's `echo ... >> .git/info/exclude` fails there).
        with open(os.path.join(ROOT, ".gitignore")) as f:
            lines = f.read().splitlines()
        for folder in ("/.corpus_pieces/", "/.gpu/", "/.gen/", "/.whl/"):
            self.assertIn(folder, lines)

    def test_link_puts_one_piece_per_folder_and_the_digest_with_the_last(self):
        tmp = self.create_tempdir().full_path
        pack, gpu = os.path.join(tmp, "pack"), os.path.join(tmp, "gpu")
        os.makedirs(pack)
        contents = {}
        for name, parts in (("model", 3), ("data", 2)):
            for k in range(parts):
                contents[f"{name}.tar.part{k}"] = os.urandom(64 + k)
            contents[f"{name}.tar.sha256"] = os.urandom(8)
        for fname, data in contents.items():
            with open(os.path.join(pack, fname), "wb") as f:
                f.write(data)
        os.makedirs(os.path.join(gpu, "stale"))  # an earlier layout goes
        result = run(["link"], PACK_DIR=pack, GPU_DIR=gpu)
        self.assertEqual(result.returncode, 0, result.stderr)
        layout = {d: sorted(os.listdir(os.path.join(gpu, d))) for d in os.listdir(gpu)}
        self.assertEqual(layout, {
            "m0": ["model.tar.part0"], "m1": ["model.tar.part1"],
            "m2": ["model.tar.part2", "model.tar.sha256"],
            "d0": ["data.tar.part0"], "d1": ["data.tar.part1", "data.tar.sha256"]})
        for d, names in layout.items():
            for fname in names:
                path = os.path.join(gpu, d, fname)
                with open(path, "rb") as f:
                    self.assertEqual(f.read(), contents[fname])
                self.assertTrue(os.path.samefile(path, os.path.join(pack, fname)))  # hard link

    def test_link_without_a_pack_names_the_missing_files(self):
        tmp = self.create_tempdir().full_path
        result = run(["link"], PACK_DIR=os.path.join(tmp, "none"), GPU_DIR=os.path.join(tmp, "g"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("none/model.tar.part*", result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1)

    def test_dry_run_prints_the_build_and_split_of_the_prose_mixtures(self):
        tmp = self.create_tempdir().full_path
        result = run(["corpus", "pieces"], DRY_RUN="1", CORPUS_DIR=os.path.join(tmp, "c"),
                     PIECES_DIR=os.path.join(tmp, "p"))
        self.assertEqual(result.returncode, 0, result.stderr)
        build = [line for line in result.stdout.splitlines() if "build_corpus.py" in line]
        self.assertLen(build, 1)
        self.assertIn("--mixtures=prose", build[0])
        self.assertIn(f"--output_dir={tmp}/c", build[0])
        self.assertIn(f"--directory={tmp}/c/prose-llama2", result.stdout)
        self.assertFalse(os.path.exists(os.path.join(tmp, "c")))  # nothing was run

    def test_a_built_corpus_is_skipped(self):
        tmp = self.create_tempdir().full_path
        for t in ("llama2", "smollm2"):
            os.makedirs(os.path.join(tmp, "c", f"prose-{t}"))
            with open(os.path.join(tmp, "c", f"prose-{t}", "corpus.json"), "w") as f:
                f.write("{}")
        result = run(["corpus"], DRY_RUN="1", CORPUS_DIR=os.path.join(tmp, "c"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("skipped", result.stdout)
        self.assertNotIn("build_corpus.py", result.stdout)

    def test_unknown_step_is_one_line_and_runs_nothing(self):
        tmp = self.create_tempdir().full_path
        result = run(["link", "bogus"], PACK_DIR=tmp, GPU_DIR=os.path.join(tmp, "g"))
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr.strip(), "error: unknown step 'bogus' (one of: all corpus "
                         "pieces wheels halo link check)")
        self.assertFalse(os.path.exists(os.path.join(tmp, "g")))


if __name__ == "__main__":
    absltest.main()
