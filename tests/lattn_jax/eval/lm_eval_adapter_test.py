"""lm-evaluation-harness runs our models (issue 33): the ``lattn_jax`` adapter against our evaluator
and against the harness's own Hugging Face backend.

* On a tiny random hybrid model (GDN + attention), the adapter's per-request log-likelihoods on
  local PIQA and LAMBADA items equal our evaluator's (1e-5, other batch sizes), its rolling
  log-likelihoods equal our perplexity windows (which are the harness's windows), and its greedy
  generations equal :class:`~lattn_jax.eval.generate.Generator`'s, cut at the ``until`` strings.
* Local harness task files (the harness's ``piqa`` and ``lambada_openai`` with local data) run
  through ``lm_eval.simple_evaluate`` with ``model="lattn_jax"`` on a tiny GGUF file give our
  evaluator's acc / acc_norm (and LAMBADA perplexity) on the first 20 items; the same through
  the command line (``python -m lattn_jax.eval.lm_eval_adapter``).

SmolLM2 against the harness's HF backend: ``lm_eval_smollm2_test.py``. Marked ``interop``;
skipped with the reason without lm-eval (``pip install -e ".[lmeval]"``). Nothing is
downloaded: the tasks read local files, the hub is offline.
"""

import contextlib
import importlib
import importlib.util
import io
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from unittest import mock

import numpy as np
import pytest
from absl.testing import absltest
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import generate as gen_lib
from lattn_jax.eval import perplexity as ppl_lib
from lattn_jax.eval import restore
from lattn_jax.eval import runner
from lattn_jax.eval import scoring
from lattn_jax.eval import tasks as tasks_lib
from tests.lattn_jax.eval import fixtures

# No hub access from the harness or `datasets` (local task files only).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EVAL_DIR = os.path.join(fixtures.HARNESS_DATA, "eval")


def _have(*modules):
    return all(importlib.util.find_spec(m) for m in modules)


_LM_EVAL = _have("lm_eval")
needs_lm_eval = absltest.skipUnless(
    _LM_EVAL, "needs lm-evaluation-harness: pip install -e '.[lmeval]'")

if _LM_EVAL:
    from lm_eval.api import instance as lm_instance

    from lattn_jax.eval import lm_eval_adapter


def _requests(kind, args):
    return [lm_instance.Instance(request_type=kind, doc={}, arguments=a, idx=i)
            for i, a in enumerate(args)]


def tiny_hybrid(seed=0):
    """A random 2-layer GDN + attention model over the byte tokenizer's 257 ids."""
    cfg = config_lib.ModelConfig(
        vocab_size=257, d_model=32, layer_pattern=("gdn", "attn"), mlp_hidden=48,
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2),
        gdn=config_lib.GatedDeltaNetConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8,
                                           head_v_dim=8, chunk_size=16))
    return model_lib.LanguageModel(cfg, rngs=nnx.Rngs(seed))


class WithoutLmEvalTest(absltest.TestCase):
    """lm-eval missing (simulated in-process: ``sys.modules["lm_eval..."] = None``; nothing is
    uninstalled): the command line ends with one line naming the extra, not a traceback."""

    ADAPTER = "lattn_jax.eval.lm_eval_adapter"
    WANT = (r"^error: lattn_jax\.eval\.lm_eval_adapter needs lm-evaluation-harness, the "
            r"package lm-eval \(.*\): pip install -e \"\.\[lmeval\]\" in the lattn-jax "
            r"checkout \(or pip install 'lattn-jax\[lmeval\]'\)$")

    def without_lm_eval(self, argv0="python"):
        stack = contextlib.ExitStack()
        # restored on exit, the adapter module (imported by this file) too
        stack.enter_context(mock.patch.dict(sys.modules, {
            name: None for name in list(sys.modules) + ["lm_eval"]
            if name == "lm_eval" or name.startswith("lm_eval.")}))
        stack.enter_context(mock.patch.object(sys, "argv", [argv0]))
        sys.modules.pop(self.ADAPTER, None)
        return stack

    def test_python_m_is_one_line_and_exit_status_1(self):
        with self.without_lm_eval(), self.assertRaises(SystemExit) as stop:
            runpy.run_module(self.ADAPTER, run_name="__main__")
        self.assertIsInstance(stop.exception.code, str)  # sys.exit(message): status 1
        self.assertRegex(stop.exception.code, self.WANT)
        self.assertNotIn("\n", stop.exception.code)

    def test_console_script_is_one_line_and_an_import_raises(self):
        with self.without_lm_eval("/venv/bin/lattn-lm-eval"), \
                self.assertRaises(SystemExit) as stop:
            importlib.import_module(self.ADAPTER)  # the script's "from ... import main"
        self.assertRegex(stop.exception.code, self.WANT)
        with self.without_lm_eval(), self.assertRaisesRegex(ImportError, "pip install -e"):
            importlib.import_module(self.ADAPTER)


@pytest.mark.interop
@needs_lm_eval
class CommandLineErrorsTest(absltest.TestCase):
    """lattn-lm-eval's bad input is one line and exit status 1, as the experiment binaries'
    (newcomer pass: our one-line messages came wrapped in the harness's ~30-line traceback)."""

    def test_a_missing_checkpoint_is_one_line(self):
        with mock.patch.object(sys, "argv", ["lattn-lm-eval"]), \
                self.assertRaises(SystemExit) as stop:
            lm_eval_adapter.main(["--model", "lattn_jax", "--model_args",
                                  "checkpoint=/no/such/run", "--tasks", "piqa"])
        self.assertIsInstance(stop.exception.code, str)  # sys.exit(message): status 1
        self.assertRegex(stop.exception.code,
                         r"^error: no such checkpoint: /no/such/run \(expected a lattn-jax")
        self.assertNotIn("\n", stop.exception.code)

    def test_the_harness_errors_are_one_line_and_other_errors_keep_their_traceback(self):
        from lm_eval import __main__ as lm_eval_main
        with mock.patch.object(lm_eval_main, "cli_evaluate",
                               side_effect=ValueError("Tasks not found:\n  piqa_typo")), \
                self.assertRaises(SystemExit) as stop:
            lm_eval_adapter.main()
        self.assertEqual(stop.exception.code, "error: Tasks not found: piqa_typo")
        with mock.patch.object(lm_eval_main, "cli_evaluate",
                               side_effect=RuntimeError("a bug")), \
                self.assertRaisesRegex(RuntimeError, "^a bug$"):
            lm_eval_adapter.main()

    def test_an_offline_download_is_one_line_pointing_to_include_path(self):
        # What this environment's datasets raises for piqa without a network (or with
        # HF_DATASETS_OFFLINE=1), and the connection errors of the libraries below it.
        import huggingface_hub.errors
        import requests
        from lm_eval import __main__ as lm_eval_main
        for error in (ConnectionError("Couldn't reach 'baber/piqa' on the Hub\n"
                                      "(LocalEntryNotFoundError)"),
                      requests.exceptions.ConnectionError("Max retries exceeded"),
                      huggingface_hub.errors.OfflineModeIsEnabled("offline mode is enabled")):
            with self.subTest(type(error).__name__), \
                    mock.patch.object(lm_eval_main, "cli_evaluate", side_effect=error), \
                    self.assertRaises(SystemExit) as stop:
                lm_eval_adapter.main(["--model", "lattn_jax", "--tasks", "piqa"])
            self.assertRegex(stop.exception.code,
                             r"^error: --tasks=piqa: a task's data could not be downloaded \(no "
                             r"network: [^\n]+\); the harness fetches its tasks' data from the "
                             r"Hugging Face hub; offline, give --include_path a directory of "
                             r"task YAML files that read local files")
            self.assertNotIn("\n", stop.exception.code)
        self.assertIn("Couldn't reach 'baber/piqa' on the Hub (LocalEntryNotFoundError)",
                      str(self._exit_code(ConnectionError(
                          "Couldn't reach 'baber/piqa' on the Hub\n(LocalEntryNotFoundError)"))))
        # Other OS errors are not "offline": they keep their traceback.
        with mock.patch.object(lm_eval_main, "cli_evaluate",
                               side_effect=PermissionError("no access")), \
                self.assertRaisesRegex(PermissionError, "^no access$"):
            lm_eval_adapter.main(["--tasks", "piqa"])

    def _exit_code(self, error):
        from lm_eval import __main__ as lm_eval_main
        with mock.patch.object(lm_eval_main, "cli_evaluate", side_effect=error), \
                self.assertRaises(SystemExit) as stop:
            lm_eval_adapter.main(["--tasks=piqa"])
        return stop.exception.code

    def test_only_option_errors_are_one_line_a_models_valueerror_keeps_its_traceback(self):
        # The harness, as far as the adapter sees it: the registered model built with
        # --model_args, then asked for log-likelihoods (cli_evaluate -> simple_evaluate).
        from lm_eval import __main__ as lm_eval_main
        rng = np.random.default_rng()
        model, tok = tiny_hybrid(int(rng.integers(1000))), tok_lib.ByteTokenizer()
        context = "".join(chr(c) for c in rng.integers(97, 123, size=int(rng.integers(3, 20))))
        requests = _requests("loglikelihood", [(context, " " + context[::-1])])

        def harness(**model_args):
            def cli_evaluate():
                lm = lm_eval_adapter.LattnJaxLM.from_model(model, tok, **model_args)
                return lm.loglikelihood(requests)
            return mock.patch.object(lm_eval_main, "cli_evaluate", side_effect=cli_evaluate)

        # A bad option: one line naming it (a ModelArgumentError, still a ValueError).
        option = str(rng.choice(["max_length", "max_gen_toks", "bucket"]))
        bad = str(rng.choice(["x", "-3", "0", "2.5"]))
        with harness(**{option: bad}), self.assertRaises(SystemExit) as stop:
            lm_eval_adapter.main()
        self.assertEqual(stop.exception.code,
                         f"error: lattn_jax: {option} must be an integer >= 1, got {bad!r}")

        # A ValueError raised inside the model's forward (under jit): it reaches the caller
        # with its traceback, which names the raising function (it was "error: <message>").
        message = f"deep in the model: shapes {int(rng.integers(2, 64))} and 3 differ"

        def broken_forward(self, *args, **kwargs):
            raise ValueError(message)

        raised = None
        with harness(batch_size=int(rng.integers(1, 4))), \
                mock.patch.object(model_lib.LanguageModel, "__call__", broken_forward):
            try:  # not assertRaises: it drops the traceback
                lm_eval_adapter.main()
            except (ValueError, SystemExit) as e:
                raised = e
        self.assertIsInstance(raised, ValueError, f"not propagated: {raised!r}")
        self.assertEqual(str(raised), message)
        frames = [f.name for f in traceback.extract_tb(raised.__traceback__)]
        self.assertEqual(frames[-1], "broken_forward", frames)
        self.assertIn("loglikelihood", frames)

        # A harness ValueError wrapping a model's (raise ... from e) keeps the traceback too.
        def wrapped():
            try:
                lm_eval_adapter.LattnJaxLM.from_model(model, tok).loglikelihood(requests)
            except ValueError as e:
                raise ValueError("the harness's wrapper") from e

        with mock.patch.object(lm_eval_main, "cli_evaluate", side_effect=wrapped), \
                mock.patch.object(model_lib.LanguageModel, "__call__", broken_forward), \
                self.assertRaisesRegex(ValueError, "^the harness's wrapper$"):
            lm_eval_adapter.main()
        self.assertTrue(issubclass(lm_eval_adapter.ModelArgumentError, ValueError))
        self.assertNotIsInstance(raised, lm_eval_adapter.ModelArgumentError)


@pytest.mark.interop
@needs_lm_eval
class CommaPathTest(absltest.TestCase):
    """A sweep run's directory (commas in its name) as checkpoint=: the harness cut it at the
    first comma and the error listed the rest as unknown arguments ['lr', 'opt', 'stack']."""

    def test_a_path_cut_at_a_comma_is_named_with_the_way_around(self):
        from lm_eval import utils as lm_utils
        runs = self.create_tempdir().full_path
        rng = np.random.default_rng()
        lr = float(rng.choice([0.001, 0.003, 0.0036]))
        names = [f"arch=gdn,stack=hybrid,opt={o},lr={lr},seed=42" for o in ("adamw", "muon")]
        for name in names:
            os.makedirs(os.path.join(runs, name))
        args = lm_utils.simple_parse_args_string(f"checkpoint={runs}/{names[1]}")
        with self.assertRaises(lm_eval_adapter.ModelArgumentError) as cm:
            lm_eval_adapter.LattnJaxLM(**args)
        full = os.path.join(runs, names[1])  # the muon run, as the stray arguments say
        self.assertEqual(str(cm.exception), (
            f"lattn_jax: checkpoint={runs}/arch=gdn does not exist: the harness splits "
            f"--model_args at every comma, so a path with commas (e.g. {full}) cannot be "
            f"passed; link it to a name without commas (ln -s '{full}' /tmp/run) and pass "
            f"checkpoint=/tmp/run"))
        # A missing path without such neighbours keeps its own error.
        self.assertIsNone(lm_eval_adapter.comma_split_checkpoint(os.path.join(runs, "other")))
        self.assertIsNone(lm_eval_adapter.comma_split_checkpoint(full))  # it exists


@pytest.mark.interop
@needs_lm_eval
class HubUnreachableTest(absltest.TestCase):
    """Without HF_HUB_OFFLINE / HF_DATASETS_OFFLINE and without a hub, lattn-lm-eval goes offline
    at once (it spent ~30 s in ~25 lines of hub retries before its error). No network here: the
    check is mocked."""

    ARGV = ["--model", "lattn_jax", "--model_args", "checkpoint=m.gguf", "--tasks", "piqa"]

    def _main(self, unreachable, argv=None, **environ):
        """main(argv) with the hub check returning ``unreachable``; (the offline variables
        cli_evaluate saw, the check's calls, stderr)."""
        from lm_eval import __main__ as lm_eval_main
        seen = {}

        def cli_evaluate():
            seen.update({v: os.environ.get(v) for v in lm_eval_adapter.OFFLINE_VARIABLES})

        clean = {k: v for k, v in os.environ.items() if k not in lm_eval_adapter.OFFLINE_VARIABLES}
        stderr = io.StringIO()
        with mock.patch.dict(os.environ, dict(clean, **environ), clear=True), \
                mock.patch.object(sys, "argv", ["lattn-lm-eval"]), \
                mock.patch.object(lm_eval_adapter, "_HUB_MODULES", ()), \
                mock.patch.object(lm_eval_adapter, "_hub_unreachable",
                                  return_value=unreachable) as check, \
                mock.patch.object(lm_eval_main, "cli_evaluate", cli_evaluate), \
                contextlib.redirect_stderr(stderr):
            lm_eval_adapter.main(self.ARGV if argv is None else argv)
        return seen, check.call_args_list, stderr.getvalue()

    def test_an_unreachable_hub_sets_offline_mode_with_one_warning_line(self):
        seen, calls, stderr = self._main("[Errno -2] Name or service not known")
        self.assertEqual(seen, {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                                "TRANSFORMERS_OFFLINE": None})
        self.assertEqual(calls, [mock.call("https://huggingface.co")])
        self.assertEqual(stderr, "warning: the Hugging Face hub (https://huggingface.co) could "
                         "not be reached ([Errno -2] Name or service not known): running offline "
                         "(HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1); tasks whose data is neither "
                         "local (--include_path) nor cached will fail\n")

    def test_a_reachable_hub_changes_nothing(self):
        seen, calls, stderr = self._main(None)
        self.assertEqual(seen, dict.fromkeys(lm_eval_adapter.OFFLINE_VARIABLES))
        self.assertLen(calls, 1)
        self.assertEqual(stderr, "")

    def test_hf_endpoint_is_the_url_checked(self):
        _, calls, _ = self._main(None, HF_ENDPOINT="https://hub.example/")
        self.assertEqual(calls, [mock.call("https://hub.example")])

    def test_no_check_when_the_user_set_a_variable_or_asked_for_help(self):
        for environ in ({"HF_HUB_OFFLINE": "0"}, {"HF_DATASETS_OFFLINE": "1"},
                        {"TRANSFORMERS_OFFLINE": "1"}):
            with self.subTest(**environ):
                seen, calls, stderr = self._main("unreachable", **environ)
                self.assertEqual(calls, [])
                self.assertEqual(stderr, "")
                self.assertEqual({k: v for k, v in seen.items() if v is not None}, environ)
        _, calls, _ = self._main("unreachable", argv=["--help"])
        self.assertEqual(calls, [])

    def test_no_check_once_the_hub_libraries_are_imported(self):
        # They read the variables at import; an in-process caller sets them itself.
        with mock.patch.object(lm_eval_adapter, "_hub_unreachable") as check, \
                mock.patch.object(lm_eval_adapter, "_HUB_MODULES", ("sys",)), \
                mock.patch.dict(os.environ, {}, clear=True):
            lm_eval_adapter._go_offline_if_hub_unreachable()
            self.assertNotIn("HF_HUB_OFFLINE", os.environ)
        check.assert_not_called()

    def test_the_check_is_one_head_request_and_any_answer_is_reachable(self):
        import urllib.error
        import urllib.request
        with mock.patch.object(urllib.request, "urlopen") as urlopen:
            self.assertIsNone(lm_eval_adapter._hub_unreachable("https://hub.example"))
        request = urlopen.call_args.args[0]
        self.assertEqual((request.full_url, request.get_method()), ("https://hub.example", "HEAD"))
        self.assertEqual(urlopen.call_args.kwargs, {"timeout": lm_eval_adapter.HUB_TIMEOUT_S})
        self.assertLessEqual(lm_eval_adapter.HUB_TIMEOUT_S, 3)
        for error, want in (
                (urllib.error.HTTPError("https://hub.example", 503, "busy", {}, None), None),
                (urllib.error.URLError(OSError(-2, "Name or service not known")),
                 "[Errno -2] Name or service not known"),
                (TimeoutError("timed out"), "timed out")):
            with self.subTest(type(error).__name__), \
                    mock.patch.object(urllib.request, "urlopen", side_effect=error):
                self.assertEqual(lm_eval_adapter._hub_unreachable("https://hub.example"), want)


@pytest.mark.interop
@needs_lm_eval
class AdapterMatchesEvaluatorTest(absltest.TestCase):
    """The adapter's three request types against our evaluator's code paths."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = tiny_hybrid()
        cls.tok = tok_lib.ByteTokenizer()
        # Other batch sizes and buckets than the evaluator's below (8 and 32): padding and
        # batching must not change scores.
        cls.lm = lm_eval_adapter.LattnJaxLM.from_model(
            cls.model, cls.tok, batch_size=3, max_length=256, bucket=64)
        cls.docs = {"piqa": tasks_lib.load_task("piqa", EVAL_DIR)[:12],
                    "lambada_openai": tasks_lib.load_task("lambada_openai", EVAL_DIR)[:8]}

    def test_loglikelihoods_equal_the_evaluators_on_piqa_and_lambada(self):
        scorer = scoring.Scorer(self.model, max_len=256, batch_size=8)
        for name, docs in self.docs.items():
            with self.subTest(task=name):
                args = [r for d in docs for r in d.requests]
                ours = scorer.loglikelihood([scoring.encode_pair(self.tok, c, x)
                                             for c, x in args])
                theirs = self.lm.loglikelihood(_requests("loglikelihood", args))
                np.testing.assert_allclose([ll for ll, _ in theirs], [ll for ll, _ in ours],
                                           rtol=1e-5, atol=1e-5)
                self.assertEqual([g for _, g in theirs], [g for _, g in ours])
                # The same through our task metrics (perplexity: exp of a mean of the above).
                grouped = [theirs[2 * i:2 * i + 2] for i in range(len(docs))] \
                    if name == "piqa" else [[r] for r in theirs]
                got = tasks_lib.process_results(name, docs, grouped)
                want = runner.score_task(scorer, name, docs,
                                         [scoring.encode_pair(self.tok, c, x) for c, x in args])
                self.assertEqual(sorted(got), sorted(want))
                np.testing.assert_allclose([got[k] for k in sorted(got)],
                                           [want[k] for k in sorted(want)], rtol=1e-5, atol=0)

    def test_empty_context_uses_the_prefix_token(self):
        ctx, cont = self.lm.encode_request("", " water")
        self.assertEqual((ctx, cont), ([self.tok.eos_id], self.tok.encode(" water")))
        self.assertEqual(self.lm.encode_request("Question: x\nAnswer: ", "yes"),
                         scoring.encode_pair(self.tok, "Question: x\nAnswer:", " yes"))

    def test_rolling_windows_are_the_harness_windows_and_sum_to_our_nll(self):
        from lm_eval import utils as lm_utils

        ids = list(range(3, 40))
        for max_len in (1, 5, 8, 37, 64):
            ours = [(inp[:len(inp) - k + 1], tgt[len(tgt) - k:])
                    for inp, tgt, k in ppl_lib.rolling_windows(ids, 0, max_len, max_len)]
            harness = [lm_utils.make_disjoint_window(w) for w in lm_utils.get_rolling_token_windows(
                token_list=ids, prefix_token=0, max_seq_len=max_len, context_len=1)]
            self.assertEqual(ours, [(list(a), list(b)) for a, b in harness], msg=f"{max_len=}")
        texts = [d.requests[0][0] + d.requests[0][1] for d in self.docs["lambada_openai"][:4]]
        lm = lm_eval_adapter.LattnJaxLM.from_model(self.model, self.tok, batch_size=3,
                                                   max_length=64)
        rolling = lm.loglikelihood_rolling(_requests("loglikelihood_rolling",
                                                     [(t,) for t in texts]))
        scorer = scoring.Scorer(self.model, max_len=64, batch_size=4)
        for text, ll in zip(texts, rolling):
            nll, n = ppl_lib.token_nll(scorer, [self.tok.encode(text)], self.tok.eos_id,
                                       max_len=64, stride=64)
            self.assertGreater(n, 64)  # several windows
            np.testing.assert_allclose(ll, -nll, rtol=1e-5, atol=1e-5)

    def test_greedy_generations_equal_the_generators(self):
        prompts = [d.requests[0][0][-60:] for d in self.docs["lambada_openai"][:5]]
        generator = gen_lib.Generator(self.model, pad_id=self.tok.eos_id, bucket=8)
        ids = [self.tok.encode(p) for p in prompts]
        out = generator.generate(ids, max_new_tokens=12, stop_tokens=[self.tok.eos_id])
        ref = [gen_lib.continuation_text(self.tok, p, [t for t in toks if t != self.tok.eos_id])
               for p, toks in zip(ids, out.tokens)]
        kw = {"until": [], "max_gen_toks": 12, "do_sample": False}
        got = self.lm.generate_until(_requests("generate_until", [(p, kw) for p in prompts]))
        self.assertEqual(got, ref)
        # A stop string (taken from row 1's own text) cuts that row there and no other row.
        stop = ref[1][3:6]
        self.assertTrue(stop)
        kw = {"until": [stop], "max_gen_toks": 12}
        got = self.lm.generate_until(_requests("generate_until", [(p, kw) for p in prompts]))
        self.assertEqual(got, [r.split(stop)[0] for r in ref])

    def test_bad_arguments_name_the_argument(self):
        make = lm_eval_adapter.LattnJaxLM.from_model
        with self.assertRaisesRegex(ValueError, r"unknown model argument\(s\) \['chekpoint'\]"):
            make(self.model, self.tok, chekpoint="x")
        with self.assertRaisesRegex(ValueError, "batch_size='auto' is not supported"):
            make(self.model, self.tok, batch_size="auto")
        with self.assertRaisesRegex(ValueError, "max_length must be an integer >= 1, got 'x'"):
            make(self.model, self.tok, max_length="x")
        with self.assertRaisesRegex(ValueError, "seed must be an integer >= 0, got 'x'"):
            make(self.model, self.tok, seed="x")
        with self.assertRaisesRegex(ValueError, "prefix_token_id=257 is outside the vocabulary"):
            make(self.model, self.tok, prefix_token_id=257)
        with self.assertRaisesRegex(ValueError, "give the model as --model_args checkpoint=PATH"):
            lm_eval_adapter.LattnJaxLM()
        with self.assertRaisesRegex(FileNotFoundError, "no such checkpoint: /no/such.gguf"):
            lm_eval_adapter.LattnJaxLM(checkpoint="/no/such.gguf")
        with self.assertRaisesRegex(ValueError, r"generation argument\(s\) \['num_beams'\]"):
            self.lm.generate_until(_requests("generate_until", [("a", {"num_beams": 2})]))
        with self.assertRaisesRegex(ValueError, "max_gen_toks=256 leaves no room"):
            self.lm.generate_until(_requests("generate_until", [("a", {"max_gen_toks": 256})]))


@pytest.mark.interop
@needs_lm_eval
class HarnessRunTest(absltest.TestCase):
    """Local harness task files, run by the harness with ``model="lattn_jax"`` on a GGUF file."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="lmeval-adapter-")
        cls.gguf = fixtures.write_tiny_gguf(os.path.join(cls.tmp, "tiny.gguf"))
        cls.task_dir = os.path.join(cls.tmp, "tasks")
        fixtures.write_harness_tasks(cls.task_dir)

    def test_simple_evaluate_gives_our_evaluators_metrics_on_20_items(self):
        import lm_eval
        from lm_eval import tasks as lm_tasks

        manager = lm_tasks.TaskManager(include_path=self.task_dir, include_defaults=False)
        out = lm_eval.simple_evaluate(
            model="lattn_jax", model_args=f"checkpoint={self.gguf},max_length=512",
            tasks=["piqa_local", "lambada_local"], task_manager=manager, limit=20,
            batch_size=4, log_samples=False, bootstrap_iters=0)
        harness = out["results"]
        self.assertEqual(out["config"]["lattn_jax_kind"], "gguf")
        restored = restore.load_model(self.gguf)
        ours = runner.run_evaluation(
            restored.model, restored.tokenizer, ["piqa", "lambada_openai"],
            runner.EvalOptions(data_dir=fixtures.HARNESS_DATA, limit=20, max_len=512,
                               batch_size=4), log=lambda *a: None)
        print("harness:", harness, "\nours:", ours)
        self.assertEqual(ours["piqa"]["n"], 20)
        self.assertEqual(harness["piqa_local"]["acc,none"], ours["piqa"]["acc"])
        self.assertEqual(harness["piqa_local"]["acc_norm,none"], ours["piqa"]["acc_norm"])
        self.assertEqual(harness["lambada_local"]["acc,none"], ours["lambada_openai"]["acc"])
        np.testing.assert_allclose(harness["lambada_local"]["perplexity,none"],
                                   ours["lambada_openai"]["perplexity"], rtol=1e-5)

    # ~25 s: a subprocess of lm_eval's CLI; test_simple_evaluate_* covers the harness in CI.
    @pytest.mark.slow
    def test_command_line(self):
        cmd = [sys.executable, "-m", "lattn_jax.eval.lm_eval_adapter", "--model", "lattn_jax",
               "--model_args", f"checkpoint={self.gguf}", "--include_path", self.task_dir,
               "--tasks", "piqa_local", "--limit", "4", "--batch_size", "4"]
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                                env=dict(os.environ, HF_HUB_OFFLINE="1",
                                         HF_DATASETS_OFFLINE="1", JAX_PLATFORMS="cpu"))
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertRegex(result.stdout, r"\|piqa_local\|.*\|acc\s*\|")


if __name__ == "__main__":
    absltest.main()
