"""lm-evaluation-harness runs lattn-jax models: the ``lattn_jax`` model of the harness (v0.4).

`lm-evaluation-harness <https://github.com/EleutherAI/lm-evaluation-harness>`_ scores a model
through an ``lm_eval.api.model.LM`` subclass with three request types. :class:`LattnJaxLM`
implements them with our model, tokenizer, :class:`~lattn_jax.eval.scoring.Scorer` and
:class:`~lattn_jax.eval.generate.Generator`, and is registered in the harness as ``lattn_jax``
when this module is imported. It loads the three kinds of model of
:func:`lattn_jax.eval.restore.load_model`: a lattn-jax training workdir, a Hugging Face
checkpoint directory (Llama / Qwen3) or a GGUF file. Install: ``pip install -e ".[lmeval]"``
(the harness without torch; the adapter needs none).

Command line. The harness's ``lm_eval`` command finds models only in its own registry (0.4.x has
no plugin entry point for models), so it does not know ``lattn_jax`` by itself. :func:`main`
registers it and then runs the harness's own command line, with all of its options; it is
installed as the console script ``lattn-lm-eval`` (``setup.cfg``), and ``python -m
lattn_jax.eval.lm_eval_adapter`` is the same::

    lattn-lm-eval --model lattn_jax --model_args checkpoint=runs/default \\
        --tasks piqa,arc_easy --batch_size 16 --limit 100
    # local task files (no hub access): a directory of task YAML files
    lattn-lm-eval --model lattn_jax --model_args checkpoint=model.gguf \\
        --include_path my_tasks/ --tasks piqa_local --batch_size 16

Python::

    import lm_eval
    from lattn_jax.eval import lm_eval_adapter  # registers "lattn_jax"

    results = lm_eval.simple_evaluate(model="lattn_jax", model_args="checkpoint=runs/default",
                                      tasks=["piqa"], batch_size=16)
    # or a model already in memory:
    lm = lm_eval_adapter.LattnJaxLM.from_model(model, tokenizer, batch_size=16)
    results = lm_eval.simple_evaluate(model=lm, tasks=["piqa"])

``--model_args`` (``key=value,...``): ``checkpoint`` (required), ``step`` (of a workdir; default
the newest), ``max_length`` (context window in tokens, default 2048), ``max_gen_toks`` (default
256), ``bucket`` (padded lengths are multiples of it, default 32), ``route`` (cross-layer routing,
default true), ``prefix_token_id`` and ``seed`` (of sampled generation). The harness's
``--batch_size`` is the number of sequences per forward pass (an integer; default here 16 when
the harness passes none; ``auto`` is not supported); ``--device`` and ``--max_batch_size`` are
ignored (JAX runs on its default backend, ``jax.devices()``).

Semantics, the same as our evaluator's (:mod:`lattn_jax.eval.scoring`), which follow the
harness's HF backend (``HFLM``):

* ``loglikelihood``: :func:`~lattn_jax.eval.scoring.encode_pair` (trailing context spaces move to
  the continuation; ``cont = encode(ctx + cont)[len(encode(ctx)):]``); an empty context becomes
  the prefix token (the harness's ``TemplateLM`` rule); requests sorted by length, batched
  ``batch_size`` at a time, padded to a multiple of ``bucket``, left-truncated to
  ``max_length + 1`` tokens; ``(sum of continuation log-probs, every token greedy)``.
* ``loglikelihood_rolling``: the document after the prefix token, in disjoint windows of
  ``max_length`` predicted tokens (:func:`lattn_jax.eval.perplexity.rolling_windows` with
  ``stride == max_length``, the windows of the harness's ``get_rolling_token_windows`` with
  ``context_len=1``), summed.
* ``generate_until``: the prompt left-truncated to ``max_length - max_gen_toks`` tokens, then
  prefill and decode with per-layer caches, batched ``batch_size`` prompts at a time (requests
  grouped by their generation arguments and sorted by length); a row stops at EOS, after
  ``max_gen_toks`` tokens, or once its text holds one of the ``until`` strings; the text is cut
  at the first ``until`` string. Greedy unless ``do_sample`` (then ``temperature``, ``top_k``,
  ``top_p``); other generation arguments are an error.

The prefix token is EOS for lattn-jax models (trained without BOS, with EOS between documents,
spec §6) and BOS for HF and GGUF models whose tokenizer has one (else EOS), as ``HFLM`` does;
``prefix_token_id`` overrides it.
"""

import json
import logging
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import generate as gen_lib
from lattn_jax.eval import perplexity as ppl_lib
from lattn_jax.eval import restore
from lattn_jax.eval import scoring

# The console script of main() (setup.cfg [options.entry_points]).
COMMAND = "lattn-lm-eval"


def _import_lm_eval():
    """``(lm_eval.api.model, lm_eval.api.registry)``.

    Raises:
      ImportError: lm-eval cannot be imported; one line naming the extra that installs it
        (setup.cfg ``lmeval``) and the import's own error.
    """
    try:
        from lm_eval.api import model  # pylint: disable=import-outside-toplevel
        from lm_eval.api import registry  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError(
            f"lattn_jax.eval.lm_eval_adapter needs lm-evaluation-harness, the package lm-eval "
            f"({e}): pip install -e \".[lmeval]\" in the lattn-jax checkout (or pip install "
            f"'lattn-jax[lmeval]')") from e
    return model, registry


try:
    lm_model, lm_registry = _import_lm_eval()
except ImportError as _error:
    # The command line (python -m ..., or the console script importing main): one line and
    # exit status 1, no traceback. An import from Python code gets the ImportError.
    if __name__ == "__main__" or os.path.basename(sys.argv[0]) == COMMAND:
        sys.exit(f"error: {_error}")
    raise

MODEL_NAME = "lattn_jax"
DEFAULT_BATCH_SIZE = 16
# Generation arguments of the harness's tasks we implement; the aliases of max_gen_toks in the
# harness's order of priority (lm_eval.models.utils.normalize_gen_kwargs).
_MAX_TOKEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
_GEN_KEYS = frozenset(("until", "do_sample", "temperature", "top_k", "top_p") + _MAX_TOKEN_KEYS)

_log = logging.getLogger(__name__)


class ModelArgumentError(config_lib.ConfigError):
    """A bad ``--model_args`` value or generation argument of the ``lattn_jax`` model (a
    ``ValueError``); the message names the argument. :func:`main` prints it as one line."""


def _int_option(name: str, value: Any, minimum: int = 1) -> int:
    """An integer option (an int, or its decimal string) of at least ``minimum``.

    Raises:
      ModelArgumentError: naming the option, for anything else.
    """
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    if number is None or number < minimum:
        raise ModelArgumentError(f"lattn_jax: {name} must be an integer >= {minimum}, got "
                                 f"{value!r}")
    return number


def comma_split_checkpoint(checkpoint: Any, stray: Optional[Dict[str, Any]] = None
                           ) -> Optional[str]:
    """The error for a ``checkpoint`` path that the harness cut at a comma, else ``None``.

    The harness splits ``--model_args`` at every comma, quotes or not, so a run directory
    whose name holds commas (every sweep run: ``<root>/runs/arch=gdn,stack=hybrid,...``)
    arrives as ``checkpoint=<root>/runs/arch=gdn`` plus stray arguments. Found when
    ``checkpoint`` does not exist but its directory holds names that continue it after a
    comma.

    Args:
      checkpoint: the ``checkpoint`` model argument as the harness passed it.
      stray: the unknown arguments the cut left (``{"stack": "hybrid", ...}``): the names
        holding every one of them as ``,key=value`` are preferred.

    Returns:
      One line naming the cut path, the full path it most likely was and a path without
      commas to pass instead (a symbolic link), or ``None``.
    """
    if not isinstance(checkpoint, str) or not checkpoint or os.path.exists(checkpoint):
        return None
    parent, base = os.path.split(os.path.normpath(checkpoint))
    try:
        names = sorted(n for n in os.listdir(parent or ".") if n.startswith(base + ","))
    except OSError:
        return None
    if not names:
        return None
    pieces = [f",{k}={v}" for k, v in (stray or {}).items()]
    names = [n for n in names if all(p in n for p in pieces)] or names
    full = os.path.join(parent, names[0])
    return (f"lattn_jax: checkpoint={checkpoint} does not exist: the harness splits "
            f"--model_args at every comma, so a path with commas (e.g. {full}) cannot be "
            f"passed; link it to a name without commas (ln -s '{os.path.abspath(full)}' "
            f"/tmp/run) and pass checkpoint=/tmp/run")


def _number_option(name: str, value: Any, cast: Callable[[Any], Any]) -> Any:
    """A numeric generation argument, ``cast(value)`` (``float`` or ``int``).

    Raises:
      ModelArgumentError: naming the argument, when ``cast`` cannot take ``value``.
    """
    try:
        return cast(value)
    except (TypeError, ValueError):
        raise ModelArgumentError(f"lattn_jax: {name} must be a number, got {value!r}") from None


def _flag(name: str, value: Any) -> bool:
    """A boolean option given as a bool or as ``true``/``false``.

    Raises:
      ModelArgumentError: naming the option, for anything else.
    """
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "1", "false", "0"):
        return str(value).strip().lower() in ("true", "1")
    raise ModelArgumentError(f"lattn_jax: {name} must be true or false, got {value!r}")


class LattnJaxLM(lm_model.LM):
    """The harness's ``LM`` interface over a lattn-jax, Hugging Face or GGUF model.

    Args:
      checkpoint: a lattn-jax training workdir, a Hugging Face checkpoint directory or a
        ``.gguf`` file (:func:`lattn_jax.eval.restore.load_model`); or give ``restored``.
      step: the checkpoint step of a workdir (``None``: the newest readable one).
      restored: an already loaded :class:`~lattn_jax.eval.restore.Restored` (Python API;
        :meth:`from_model` builds one), instead of ``checkpoint``.
      batch_size: sequences per forward pass; ``None`` (the harness passed none) is
        :data:`DEFAULT_BATCH_SIZE`.
      max_batch_size, device: the harness passes them to every model; ignored (the batch is
        fixed, JAX picks its backend).
      max_length: the context window ``L`` in tokens: log-likelihood inputs are left-truncated to
        it, rolling windows predict ``L`` tokens, prompts keep ``L - max_gen_toks`` tokens.
      max_gen_toks: generated tokens when a request does not say.
      bucket: padded lengths are multiples of it (fewer compilations).
      route: run the cross-layer routing contributions (the training forward).
      prefix_token_id: the token before an empty context and before rolling documents
        (default: EOS for lattn-jax models, else BOS if the tokenizer has one, else EOS).
      seed: PRNG seed of sampled generation (``do_sample``).
      **unknown: any other ``--model_args`` key is an error.

    Raises:
      ModelArgumentError: (a ``ValueError``) no or both of ``checkpoint`` and ``restored``, an
        unknown argument, a bad value (each message names the argument), a ``checkpoint``
        path cut at a comma by the harness (:func:`comma_split_checkpoint`).
      ConfigError, FileNotFoundError: a ``checkpoint`` that is not one (naming the path), from
        :func:`restore.load_model`; its other errors (e.g. a ``ValueError`` of a loader) as
        they are.
    """

    def __init__(self, checkpoint: Optional[str] = None, step: Optional[int] = None, *,
                 restored: Optional[restore.Restored] = None,
                 batch_size: Optional[Any] = None, max_batch_size: Optional[Any] = None,
                 device: Optional[str] = None, max_length: int = 2048, max_gen_toks: int = 256,
                 bucket: int = 32, route: Any = True, prefix_token_id: Optional[int] = None,
                 seed: int = 0, **unknown):
        super().__init__()
        cut = comma_split_checkpoint(checkpoint, unknown)
        if cut:  # before the stray arguments the cut left
            raise ModelArgumentError(cut)
        if unknown:
            raise ModelArgumentError(
                f"lattn_jax: unknown model argument(s) {sorted(unknown)}; accepted: "
                "checkpoint, step, max_length, max_gen_toks, bucket, route, prefix_token_id, "
                "seed (and the harness's --batch_size)")
        if checkpoint is None and restored is None:
            raise ModelArgumentError(
                "lattn_jax: give the model as --model_args checkpoint=PATH (a lattn-jax "
                "training workdir, a Hugging Face directory or a .gguf file)")
        if restored is not None and (checkpoint is not None or step is not None):
            raise ModelArgumentError("lattn_jax: give checkpoint (and step) or restored, not "
                                     "both")
        if isinstance(batch_size, str) and batch_size.strip().lower().startswith("auto"):
            raise ModelArgumentError(
                f"lattn_jax: batch_size={batch_size!r} is not supported; give a number of "
                f"sequences per forward pass, e.g. --batch_size 16")
        self._batch_size = (DEFAULT_BATCH_SIZE if batch_size is None
                            else _int_option("batch_size", batch_size))
        self._max_length = _int_option("max_length", max_length)
        self._max_gen_toks = _int_option("max_gen_toks", max_gen_toks)
        self._bucket = _int_option("bucket", bucket)
        self._route = _flag("route", route)
        self._seed = _int_option("seed", seed, minimum=0)
        if device is not None:
            _log.info("lattn_jax: device=%s is ignored; JAX runs on its default backend", device)
        del max_batch_size  # fixed batches
        if restored is None:
            step = None if step is None else _int_option("step", step, minimum=0)
            restored = restore.load_model(str(checkpoint), step)
        self.restored = restored
        self.model: model_lib.LanguageModel = restored.model
        self.tokenizer: tok_lib.Tokenizer = restored.tokenizer
        if prefix_token_id is not None:
            prefix = _int_option("prefix_token_id", prefix_token_id, minimum=0)
            if prefix >= self.model.config.vocab_size:
                raise ModelArgumentError(
                    f"lattn_jax: prefix_token_id={prefix_token_id!r} is outside the vocabulary "
                    f"[0, {self.model.config.vocab_size})")
        elif restored.kind == "lattn_jax" or self.tokenizer.bos_id is None:
            prefix = self.tokenizer.eos_id
        else:
            prefix = self.tokenizer.bos_id
        self._prefix_token_id = int(prefix)
        self._scorer = scoring.Scorer(self.model, max_len=self._max_length,
                                      batch_size=self._batch_size, bucket=self._bucket,
                                      route=self._route)
        self._generator: Optional[gen_lib.Generator] = None  # built on first use

    @classmethod
    def from_model(cls, model: model_lib.LanguageModel, tokenizer: tok_lib.Tokenizer, *,
                   kind: restore.ModelKind = "lattn_jax", **options) -> "LattnJaxLM":
        """The adapter over a model already in memory.

        Args:
          model: a :class:`~lattn_jax.model.LanguageModel` (parameters captured as they are).
          tokenizer: its tokenizer.
          kind: where it came from (sets the default prefix token: EOS for ``"lattn_jax"``).
          **options: the keyword arguments of :class:`LattnJaxLM` (``batch_size``, ...).

        Raises:
          ModelArgumentError: as :class:`LattnJaxLM`.
        """
        restored = restore.Restored(model=model, tokenizer=tokenizer, config=None, step=None,
                                    kind=kind, path="<in memory>")
        return cls(restored=restored, **options)

    # --- properties the harness reads ---------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """Sequences per forward pass."""
        return self._batch_size

    @property
    def max_length(self) -> int:
        """The context window in tokens."""
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        """Generated tokens when a request does not say."""
        return self._max_gen_toks

    @property
    def eot_token_id(self) -> int:
        """The tokenizer's EOS id (ends a generation)."""
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        """The token before an empty context and before every rolling document."""
        return self._prefix_token_id

    @property
    def tokenizer_name(self) -> str:
        """The tokenizer's name (the harness fingerprints request caches with it)."""
        return str(getattr(self.tokenizer, "name", type(self.tokenizer).__name__))

    def get_model_info(self) -> Dict[str, Any]:
        """What the harness writes into ``results["config"]``: the model's source and shape."""
        r = self.restored
        return {"lattn_jax_checkpoint": r.path, "lattn_jax_kind": r.kind,
                "lattn_jax_step": r.step,
                "lattn_jax_layer_pattern": "-".join(self.model.config.layer_pattern),
                "lattn_jax_tokenizer": self.tokenizer_name}

    # --- requests -----------------------------------------------------------------------------

    def encode_request(self, context: str, continuation: str) -> scoring.TokenPair:
        """Token ids of one ``loglikelihood`` request.

        Args:
          context: the conditioning text (may be empty).
          continuation: the scored text.

        Returns:
          ``(context_ids, continuation_ids)``: :func:`scoring.encode_pair` for a non-empty
          context; for an empty one ``([prefix], encode(continuation))``, or the continuation's
          first token as the context when it is the prefix token itself (the harness's
          ``TemplateLM.loglikelihood``).

        Raises:
          ValueError: if the continuation encodes to no tokens.
        """
        if context:
            return scoring.encode_pair(self.tokenizer, context, continuation)
        cont = self.tokenizer.encode(continuation)
        if not cont:
            raise ValueError(f"continuation {continuation!r} encodes to no tokens")
        if cont[0] == self.prefix_token_id:
            return cont[:1], cont[1:]
        return [self.prefix_token_id], cont

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> List[Tuple[float, bool]]:
        """Continuation log-likelihoods of ``(context, continuation)`` requests.

        Args:
          requests: harness ``Instance`` s whose ``args`` are ``(context, continuation)``.
          disable_tqdm: accepted for the harness; there is no progress bar.

        Returns:
          Per request, in request order, ``(sum_i log p(cont_i | ...), is_greedy)`` (float64
          sum of fp32 log-probs; ``is_greedy``: every continuation token is the argmax).

        Raises:
          ValueError: a continuation with no tokens or longer than ``max_length``.
        """
        args = [tuple(r.args) for r in requests]
        results = self._scorer.loglikelihood([self.encode_request(c, x) for c, x in args])
        for a, res in zip(args, results):
            self.cache_hook.add_partial("loglikelihood", a, res)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
        """Log-likelihoods of whole documents (perplexity tasks), in disjoint windows.

        Args:
          requests: ``Instance`` s whose ``args`` are ``(text,)``.
          disable_tqdm: accepted for the harness.

        Returns:
          Per request, the sum over the document's tokens of ``log p(x_i | prefix, x_<i)`` with
          at most ``max_length`` tokens of input per window; ``0.0`` for a text with no tokens.
        """
        pairs: List[scoring.TokenPair] = []
        owners: List[int] = []
        for i, r in enumerate(requests):
            ids = self.tokenizer.encode(r.args[0])
            if not ids:
                continue
            for inp, tgt, k in ppl_lib.rolling_windows(ids, self.prefix_token_id,
                                                       self._max_length, self._max_length):
                # inputs + the last target == context + continuation (the k new targets).
                pairs.append((inp[:len(inp) - k + 1], tgt[len(tgt) - k:]))
                owners.append(i)
        totals = np.zeros(len(requests), np.float64)
        for i, (ll, _) in zip(owners, self._scorer.loglikelihood(pairs)):
            totals[i] += ll
        out = [float(t) for t in totals]
        for r, ll in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood_rolling", tuple(r.args), ll)
        return out

    def generation_options(self, gen_kwargs: Optional[Dict[str, Any]]
                           ) -> Tuple[List[str], int, gen_lib.SamplingConfig]:
        """Reads a request's generation arguments.

        Args:
          gen_kwargs: the harness's dict: ``until`` (a string or list of strings),
            ``max_gen_toks`` (or ``max_new_tokens``, ``max_tokens``, ``max_completion_tokens``),
            ``do_sample``, ``temperature``, ``top_k``, ``top_p``.

        Returns:
          ``(until, max_gen_toks, sampling)``: greedy unless ``do_sample`` is true (or, with no
          ``do_sample``, a positive ``temperature``), as the harness normalises them.

        Raises:
          ModelArgumentError: (a ``ValueError``) naming an argument we do not implement
            (``num_beams``, ...) or a bad value.
        """
        kw = dict(gen_kwargs or {})
        unknown = sorted(set(kw) - _GEN_KEYS)
        if unknown:
            raise ModelArgumentError(
                f"lattn_jax: generation argument(s) {unknown} are not supported (supported: "
                f"{', '.join(sorted(_GEN_KEYS))})")
        until = kw.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        if not all(isinstance(u, str) for u in until):
            raise ModelArgumentError(f"lattn_jax: until must be a string or a list of strings, "
                                     f"got {kw.get('until')!r}")
        given = [k for k in _MAX_TOKEN_KEYS if kw.get(k) is not None]
        n = (_int_option(given[0], kw[given[0]]) if given else self._max_gen_toks)
        temperature = _number_option("temperature", kw.get("temperature") or 0.0, float)
        do_sample = kw.get("do_sample")
        do_sample = temperature > 0.0 if do_sample is None else _flag("do_sample", do_sample)
        if not do_sample:
            return until, n, gen_lib.SamplingConfig()
        return until, n, gen_lib.SamplingConfig(
            temperature=temperature if temperature > 0.0 else 1.0,
            top_k=_number_option("top_k", kw.get("top_k") or 0, int),
            top_p=_number_option("top_p", kw.get("top_p") or 1.0, float))

    def generate_until(self, requests, disable_tqdm: bool = False) -> List[str]:
        """Generated continuations of ``(context, gen_kwargs)`` requests.

        Args:
          requests: ``Instance`` s whose ``args`` are ``(context, gen_kwargs)``.
          disable_tqdm: accepted for the harness.

        Returns:
          Per request, in request order, the generated text cut before the first ``until``
          string (EOS ends a row and is not part of the text).

        Raises:
          ModelArgumentError: from :meth:`generation_options`, or ``max_gen_toks >=
            max_length`` (no room for the prompt).
        """
        args = [tuple(r.args) for r in requests]
        groups: Dict[str, List[int]] = {}
        for i, (_, kw) in enumerate(args):
            groups.setdefault(json.dumps(kw, sort_keys=True, default=str), []).append(i)
        out: List[str] = [""] * len(args)
        for indices in groups.values():
            until, n, sampling = self.generation_options(args[indices[0]][1])
            if n >= self._max_length:
                raise ModelArgumentError(f"lattn_jax: max_gen_toks={n} leaves no room for the "
                                         f"prompt in max_length={self._max_length}")
            prompts = {i: self._prompt_ids(args[i][0], self._max_length - n) for i in indices}
            for i, text in zip(indices, self._generate([prompts[i] for i in indices], n, until,
                                                       sampling)):
                out[i] = text
        for a, text in zip(args, out):
            self.cache_hook.add_partial("generate_until", a, text)
        return out

    def _prompt_ids(self, context: str, keep: int) -> List[int]:
        ids = self.tokenizer.encode(context) if context else []
        return ids[-keep:] if ids else [self.prefix_token_id]

    def _generate(self, prompts: Sequence[List[int]], n: int, until: Sequence[str],
                  sampling: gen_lib.SamplingConfig) -> List[str]:
        """Texts generated from ``prompts`` (batched by length, cut at ``until``)."""
        if self._generator is None:
            self._generator = gen_lib.Generator(self.model, pad_id=self.tokenizer.eos_id,
                                                bucket=self._bucket, route=self._route)
        bs = self._batch_size
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        texts: List[str] = [""] * len(prompts)
        for start in range(0, len(order), bs):
            idx = order[start:start + bs]
            batch = [prompts[i] for i in idx]
            if len(order) > bs:  # the last batch keeps the shape of the others (one compile)
                batch += [batch[-1]] * (bs - len(batch))

            def stop_fn(row, ids, batch=batch):
                return bool(until) and any(u in self._text(batch[row], ids) for u in until)

            result = self._generator.generate(batch, max_new_tokens=n, sampling=sampling,
                                              stop_tokens=[self.tokenizer.eos_id],
                                              seed=self._seed, stop_fn=stop_fn)
            for row, i in enumerate(idx):
                texts[i] = _cut(self._text(batch[row], result.tokens[row]), until)
        return texts

    def _text(self, prompt: Sequence[int], ids: Sequence[int]) -> str:
        ids = list(ids)
        if ids and ids[-1] == self.tokenizer.eos_id:
            ids = ids[:-1]
        return gen_lib.continuation_text(self.tokenizer, prompt, ids)


def _cut(text: str, until: Sequence[str]) -> str:
    """``text`` before the first occurrence of any non-empty ``until`` string (the harness's
    ``postprocess_generated_text``)."""
    for term in until:
        if term:
            text = text.split(term)[0]
    return text


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Runs the harness's command line with ``lattn_jax`` registered.

    Without lm-eval installed, ``python -m lattn_jax.eval.lm_eval_adapter`` and ``lattn-lm-eval``
    end while importing this module, with one line naming the extra to install (``pip install
    -e ".[lmeval]"``) and exit status 1.

    Bad input ends the same way, as the experiment binaries do (:func:`_is_bad_input`): our
    option checks' errors (:class:`ModelArgumentError` for ``--model_args`` and generation
    arguments, ``ConfigError`` for a checkpoint that is not one), the harness's own
    ``ValueError`` checks of its options (e.g. ``Tasks not found``), ``FileNotFoundError`` (a
    missing checkpoint) and ``ImportError`` (a package the model file needs) are printed as
    ``error: <message>`` on one line, exit status 1, instead of the harness's traceback. Any
    other ``ValueError`` raised in or under our code (the model, the scorer, a loader, JAX
    below them) is a failure, not bad input: it propagates with its traceback.

    A task whose dataset the harness must download, without a network (or with
    ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set), ends the same way (:func:`_is_offline`:
    a ``ConnectionError``, or a connection / timeout / offline-mode error of ``requests``,
    ``urllib3``, ``httpx``, ``huggingface_hub`` or ``datasets``): one line saying the task's
    data could not be downloaded and pointing to ``--include_path`` with local task configs,
    as README.md's offline instructions say. Without those variables set, the hub is tried once
    first (:func:`_go_offline_if_hub_unreachable`, a few seconds at most): when it cannot be
    reached, the run goes offline (both variables set to 1, one ``warning:`` line), so a hub task
    fails at once rather than after ~30 s of retries, and local or cached tasks still run.

    Args:
      argv: the command line after the program name (default: ``sys.argv[1:]``); the options of
        ``lm_eval`` (``--model lattn_jax --model_args checkpoint=... --tasks ...``).

    Raises:
      SystemExit: on bad input or a download that failed offline (the one line), and from the
        harness's argument parser.
    """
    from lm_eval import __main__ as lm_eval_main  # pylint: disable=import-outside-toplevel

    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    _go_offline_if_hub_unreachable()
    try:
        lm_eval_main.cli_evaluate()
    except (ValueError, FileNotFoundError, ImportError) as e:
        if not _is_bad_input(e):
            raise
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        sys.exit(f"error: {text or type(e).__name__}")
    except Exception as e:  # pylint: disable=broad-except  # only _is_offline's; others re-raised
        if not _is_offline(e):
            raise
        reason = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        sys.exit(f"error: {_tasks_named(sys.argv)}a task's data could not be downloaded (no "
                 f"network: {reason or type(e).__name__}); {OFFLINE_HINT}")


# The environment variables of Hugging Face's offline mode (huggingface_hub, datasets,
# transformers).
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
# Seconds to wait for the hub before a run goes offline.
HUB_TIMEOUT_S = 3.0
# The libraries that read the offline variables once, when they are imported.
_HUB_MODULES = ("huggingface_hub", "datasets")


def _hub_endpoint() -> str:
    """The hub's URL: ``HF_ENDPOINT``, as huggingface_hub reads it, else huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hub_unreachable(url: str, timeout: float = HUB_TIMEOUT_S) -> Optional[str]:
    """Why ``url`` cannot be reached (one HEAD request, proxies as the environment sets them),
    or ``None`` when it answers, with any HTTP status."""
    import urllib.error  # pylint: disable=import-outside-toplevel
    import urllib.request  # pylint: disable=import-outside-toplevel

    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:  # an answer (a 4xx or 5xx status): the hub is there
        return None
    except (OSError, ValueError) as e:  # URLError, a timeout, a bad HF_ENDPOINT
        reason = getattr(e, "reason", None) or e
        return str(reason) or type(e).__name__


def _go_offline_if_hub_unreachable() -> None:
    """Sets ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1`` when the hub cannot be reached.

    Offline, the harness's datasets calls retry every hub request for about 30 s (some 25 warning
    lines) before the error; in offline mode they fail at once (:func:`_is_offline` makes that one
    line), and tasks whose data is local (``--include_path``) or cached run. Nothing is checked
    when one of :data:`OFFLINE_VARIABLES` is set (the user chose), for ``-h``/``--help``, or
    when ``huggingface_hub`` or ``datasets`` is already imported (they read the variables at
    import: an in-process caller sets them itself). Online, nothing changes.
    """
    if any(v in os.environ for v in OFFLINE_VARIABLES):
        return
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        return
    if any(m in sys.modules for m in _HUB_MODULES):
        return
    url = _hub_endpoint()
    reason = _hub_unreachable(url)
    if reason is None:
        return
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    print(f"warning: the Hugging Face hub ({url}) could not be reached ({reason}): running "
          f"offline (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1); tasks whose data is neither local "
          f"(--include_path) nor cached will fail", file=sys.stderr)


# README.md's offline instructions ("The harness fetches its tasks' data from the Hugging Face
# hub; offline, ...").
OFFLINE_HINT = ("the harness fetches its tasks' data from the Hugging Face hub; offline, give "
                "--include_path a directory of task YAML files that read local files "
                "(dataset_path: json with data_files; tests/lattn_jax/eval/fixtures.py writes "
                "PIQA and LAMBADA ones), as README.md describes")
# Libraries whose connection errors mean "no network" (besides the builtin ConnectionError).
_NETWORK_MODULES = ("requests", "urllib3", "httpx", "huggingface_hub", "datasets")
_NETWORK_ERROR_WORDS = ("Connection", "Connect", "Timeout", "Offline")


def _is_offline(error: BaseException) -> bool:
    """Whether ``error`` says a download failed for want of a network: a builtin
    ``ConnectionError`` (what ``datasets`` raises for a dataset it cannot reach, also
    ``huggingface_hub``'s ``OfflineModeIsEnabled``), or an exception of a class of
    ``requests``, ``urllib3``, ``httpx``, ``huggingface_hub`` or ``datasets`` whose name (or a
    base class's, of those modules) says connection, timeout or offline mode."""
    if isinstance(error, ConnectionError):
        return True
    for cls in type(error).__mro__:
        if (cls.__module__.split(".")[0] in _NETWORK_MODULES
                and any(w in cls.__name__ for w in _NETWORK_ERROR_WORDS)):
            return True
    return False


def _tasks_named(argv: Sequence[str]) -> str:
    """``"--tasks=<value>: "`` of the command line ``argv``, or ``""`` without one."""
    for i, arg in enumerate(argv):
        if arg.startswith("--tasks="):
            return f"{arg}: "
        if arg == "--tasks" and i + 1 < len(argv):
            return f"--tasks={argv[i + 1]}: "
    return ""


# Top-level packages of this repository: a ValueError raised in or under their code (below
# main) is not one of the harness's option checks.
_OUR_PACKAGES = ("lattn_jax", "pallas_kernels")


def _is_bad_input(error: BaseException) -> bool:
    """Whether :func:`main` ends on ``error`` with one line (bad input) rather than re-raising.

    Args:
      error: an exception caught in :func:`main`; its traceback starts at ``main``'s frame.

    Returns:
      True for a ``ConfigError`` (our option checks, :class:`ModelArgumentError` included),
      a ``FileNotFoundError`` or ``ImportError``, and a ``ValueError`` whose traceback holds
      no frame of our packages below ``main``, nor that of an exception it was raised from
      (the harness's own checks of its command line and tasks); False for any other
      ``ValueError`` (raised in, or in a library called by, our model code, even when the
      harness re-raised it as another one).
    """
    if isinstance(error, (config_lib.ConfigError, FileNotFoundError, ImportError)):
        return True
    tb = error.__traceback__
    tb = tb.tb_next if tb is not None else None  # main's own frame
    seen = {id(error)}
    while True:
        while tb is not None:
            module = str(tb.tb_frame.f_globals.get("__name__", ""))
            if module.split(".")[0] in _OUR_PACKAGES:
                return False
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
        if error is None or id(error) in seen or isinstance(error, config_lib.ConfigError):
            return True
        seen.add(id(error))
        tb = error.__traceback__


if __name__ == "__main__":
    # Run as ``python -m``: this file is ``__main__``; the registered class is the one of the
    # imported module (registering both would give two classes one name).
    from lattn_jax.eval import lm_eval_adapter  # pylint: disable=import-self

    lm_eval_adapter.main()
else:
    lm_registry.register_model(MODEL_NAME)(LattnJaxLM)
