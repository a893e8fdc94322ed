"""Tokenizers behind one small interface: SentencePiece, Hugging Face, GGUF vocabularies, bytes.

The paper tokenizes with the LLaMA-2 SentencePiece model (vocabulary 32000), without BOS, and
appends EOS (id 2) after every document (spec §6). The pipeline appends EOS itself, so ``encode``
never adds BOS or EOS.

Kinds (``make_tokenizer(kind, path)``):

- ``"sentencepiece"``: a SentencePiece ``.model`` file (LLaMA-2's is bundled and the default);
- ``"huggingface"``: a Hugging Face ``tokenizer.json``, run by the ``tokenizers`` library; EOS
  is ``eos_token`` of a ``tokenizer_config.json`` next to it, else the first of
  ``<|endoftext|>``, ``</s>``, ``<|end_of_text|>``, ``<eos>`` in the vocabulary;
- ``"gguf"``: the vocabulary embedded in a GGUF model file (``tokenizer.ggml.*`` keys, read
  with the ``gguf`` library). ``tokenizer.ggml.model == "llama"`` vocabularies are rebuilt as a
  SentencePiece BPE model (as llama.cpp's converter wrote them from one), ``"gpt2"`` ones as a
  byte-level BPE for ``tokenizers`` with the pre-tokenizer named by ``tokenizer.ggml.pre``;
- ``"byte"``: UTF-8 bytes, EOS 256, vocabulary 257 (no files; for tests and tiny runs).

Every tokenizer has a ``sha256`` fingerprint of the file it was loaded from (``prepare_data``
writes it into the token-shard manifest, and ``build_datasets`` refuses shards made with another
tokenizer).
"""

import abc
import hashlib
import json
import os
from collections.abc import Sequence

import sentencepiece as spm

from lattn_jax import assets
from lattn_jax.data import sources

__all__ = [
    "KINDS",
    "ByteTokenizer",
    "GGUFTokenizer",
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "file_sha256",
    "make_tokenizer",
]

KINDS = ("sentencepiece", "huggingface", "gguf", "byte")

# EOS candidates for a tokenizer.json without a tokenizer_config.json, in order of preference.
_HF_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


def file_sha256(path: str, chunk_size: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


class Tokenizer(abc.ABC):
    """Text <-> token ids. ``encode`` adds no special tokens (no BOS, no EOS).

    Attributes:
        kind: one of ``KINDS``.
        name: short identifier, e.g. ``"sentencepiece:tokenizer.model"`` or ``"byte"``.
        path: the file the tokenizer was loaded from (``None`` for ``"byte"``).
        sha256: hex sha256 of that file (of ``b"byte"`` for the byte tokenizer).
        vocab_size: number of ids; every id is in ``[0, vocab_size)``.
        eos_id: id appended after every document by the pipeline.
        bos_id: id of the BOS token, or ``None`` if the tokenizer has none. The pipeline never
            emits it.
    """

    kind: str
    name: str
    path: str | None
    sha256: str
    vocab_size: int
    eos_id: int
    bos_id: int | None

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Returns the ids of ``text``, without BOS or EOS."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Returns the text of ``ids``; special ids (BOS, EOS) produce no text."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encodes many texts; subclasses may override with a faster batched call."""
        return [self.encode(t) for t in texts]

    def describe(self) -> dict:
        """JSON-able identity: kind, name, file name, sha256, vocab size and special ids."""
        return {"kind": self.kind, "name": self.name,
                "file": None if self.path is None else os.path.basename(self.path),
                "sha256": self.sha256, "vocab_size": self.vocab_size, "eos_id": self.eos_id,
                "bos_id": self.bos_id}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, "
                f"eos_id={self.eos_id}, bos_id={self.bos_id})")


def _check_file(path, what: str) -> str:
    """``path`` as a string, when it is a file.

    Raises:
      FileNotFoundError: ``"<what> not found: <path>"``, or for a directory ``"<what> not
        found: <path> is a directory (holding a, b, ...); give the file itself"``.
    """
    path = os.fspath(path)
    if os.path.isdir(path):  # "not found: <dir>" read as a missing directory
        raise FileNotFoundError(f"{what} not found: {path} is a directory (holding "
                                f"{sources.directory_listing(path)}); give the file itself")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def unreadable_gguf(path, error) -> ValueError:
    """The one error for a GGUF file that does not parse (truncated, garbage, inconsistent
    shapes): ``<path> is not a readable GGUF file: <why>``, a
    :class:`lattn_jax.config.ConfigError` (a ``ValueError``) so that every binary prints it as one
    line. Shared by :func:`open_gguf`, the tokenizer and the weight loader
    (:func:`lattn_jax.halo.loaders.load_gguf`)."""
    from lattn_jax import config as config_lib  # lattn_jax.config imports this package

    return config_lib.ConfigError(f"{path} is not a readable GGUF file: {error}")


def open_gguf(path):
    """A ``gguf.GGUFReader`` of ``path`` (the package parses the header and every tensor's
    layout here).

    Raises:
        FileNotFoundError: ``path`` is not a file.
        lattn_jax.config.ConfigError: the file does not parse (:func:`unreadable_gguf`).
    """
    import gguf  # optional dependency (setup.cfg extra "data")

    path = _check_file(path, "GGUF file")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as e:  # noqa: BLE001 - gguf raises ValueError/struct.error/IndexError/...
        raise unreadable_gguf(path, e) from e


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model, e.g. the LLaMA-2 ``tokenizer.model`` (vocab 32000, BOS 1, EOS 2).

    Args:
        path: the ``.model`` file (serialized ``ModelProto``).
        model_proto: serialized ``ModelProto`` bytes to load instead of reading ``path`` (used
            by ``GGUFTokenizer``; ``path`` then only names the origin).
        sha256: fingerprint to report instead of the file's sha256 (with ``model_proto``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not a SentencePiece model, or it has no EOS piece.
    """

    kind = "sentencepiece"

    def __init__(self, path: str, *, model_proto: bytes | None = None, sha256: str | None = None):
        path = _check_file(path, "SentencePiece model")
        self.path = path
        try:
            if model_proto is None:
                self._sp = spm.SentencePieceProcessor(model_file=path)
            else:
                self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        except (RuntimeError, OSError) as e:
            raise ValueError(f"{path} is not a SentencePiece model: {e}") from e
        self.name = f"sentencepiece:{os.path.basename(path)}"
        self.sha256 = sha256 or file_sha256(path)
        self.vocab_size = int(self._sp.get_piece_size())
        self.eos_id = int(self._sp.eos_id())
        if self.eos_id < 0:
            raise ValueError(f"SentencePiece model {path} defines no EOS piece")
        bos = int(self._sp.bos_id())
        self.bos_id = bos if bos >= 0 else None

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int, add_bos=False, add_eos=False)

    # Threads of a batched encode; None: the library's default (all cores). prepare_data's
    # worker processes set 1, since they already run one per core.
    num_threads: int | None = None

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # One call into the C++ library (it parallelises over texts internally).
        if self.num_threads is None:
            return self._sp.encode(list(texts), out_type=int, add_bos=False, add_eos=False)
        return self._sp.encode(list(texts), out_type=int, add_bos=False, add_eos=False,
                               num_threads=self.num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])


class HuggingFaceTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` run by the ``tokenizers`` library.

    Args:
        path: the ``tokenizer.json`` file.
        eos_token: the EOS token's text; ``None`` reads ``eos_token`` from a
            ``tokenizer_config.json`` in the same directory, else takes the first of
            ``<|endoftext|>``, ``</s>``, ``<|end_of_text|>``, ``<eos>`` that is in the vocabulary.
        bos_token: the BOS token's text (informational; never emitted), same lookup but no
            fallback.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file cannot be parsed, or no EOS token can be found (the message names
            the file).
    """

    kind = "huggingface"

    def __init__(self, path: str, *, eos_token: str | None = None, bos_token: str | None = None,
                 _tokenizer=None, _sha256: str | None = None, _name: str | None = None):
        import tokenizers  # optional dependency (setup.cfg extra "data")

        path = _check_file(path, "tokenizer.json")
        self.path = path
        from_file = _tokenizer is None
        if from_file:
            try:
                _tokenizer = tokenizers.Tokenizer.from_file(path)
            except Exception as e:  # noqa: BLE001 - the Rust library raises plain Exception
                raise ValueError(f"{path} is not a Hugging Face tokenizer.json: {e}") from e
        self._tok = _tokenizer
        self.name = _name or f"huggingface:{os.path.basename(path)}"
        self.sha256 = _sha256 or file_sha256(path)
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        config = _read_tokenizer_config(os.path.dirname(path)) if from_file else {}
        eos_token = eos_token or _token_text(config.get("eos_token"))
        bos_token = bos_token or _token_text(config.get("bos_token"))
        if eos_token is None:
            eos_token = next(
                (t for t in _HF_EOS_CANDIDATES if self._tok.token_to_id(t) is not None), None)
        eos = None if eos_token is None else self._tok.token_to_id(eos_token)
        if eos is None:
            raise ValueError(f"{path}: cannot find the EOS token (tried {eos_token!r} and "
                             f"{', '.join(_HF_EOS_CANDIDATES)}); pass eos_token")
        self.eos_id = int(eos)
        bos = None if bos_token is None else self._tok.token_to_id(bos_token)
        self.bos_id = None if bos is None else int(bos)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # The Rust library parallelises over texts (TOKENIZERS_PARALLELISM).
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


def _read_tokenizer_config(directory: str) -> dict:
    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read tokenizer_config.json: {e}") from e
    return config if isinstance(config, dict) else {}


def _token_text(value) -> str | None:
    """``eos_token`` in tokenizer_config.json is a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


# GGUF token types (gguf.TokenType); SentencePiece uses the same numbers for its piece types.
_GGUF_CONTROL, _GGUF_USER_DEFINED, _GGUF_BYTE = 3, 4, 6
# tokenizer.ggml.pre values handled for "gpt2" vocabularies, by pre-tokenizer (llama.cpp groups).
_GPT2_PRE = ("default", "gpt-2", "gpt2", "mpt", "olmo", "jais")
_DIGITS_GPT2_PRE = ("smollm", "starcoder", "refact", "codeshell", "command-r")


def _gguf_field(reader, key: str, path: str, default=None, required: bool = True):
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise ValueError(f"{path}: GGUF file has no {key!r} (no embedded tokenizer)")
        return default
    return field.contents()


class GGUFTokenizer(Tokenizer):
    """The tokenizer vocabulary embedded in a GGUF model file.

    ``tokenizer.ggml.model == "llama"`` (SentencePiece vocabularies: LLaMA-1/2, Mistral, ...) is
    rebuilt as a SentencePiece BPE model from ``tokens``, ``scores`` and ``token_type`` (identity
    normaliser, a dummy prefix unless ``add_space_prefix`` is false, byte fallback if there are
    byte tokens), which reproduces the original model's ids. ``"gpt2"`` vocabularies (GPT-2,
    SmolLM, StarCoder, ...) become a byte-level BPE from ``tokens`` and ``merges``, with the
    pre-tokenizer of ``tokenizer.ggml.pre``; control and user-defined tokens are special tokens.

    Args:
        path: the ``.gguf`` file (only its metadata is read; tensors are memory-mapped, not
            loaded).
        reader: the file's ``gguf.GGUFReader`` if the caller already opened it (parsing the
            metadata of a 49k-token vocabulary takes seconds; the model loader shares its own).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: not a GGUF file, no embedded tokenizer, or a tokenizer model or
            pre-tokenizer that is not supported (the message names the file and the value).
    """

    kind = "gguf"

    def __init__(self, path: str, *, reader=None):
        path = _check_file(path, "GGUF file")
        self.path = path
        reader = reader if reader is not None else open_gguf(path)
        model = _gguf_field(reader, "tokenizer.ggml.model", path)
        tokens = list(_gguf_field(reader, "tokenizer.ggml.tokens", path))
        types = list(_gguf_field(reader, "tokenizer.ggml.token_type", path,
                                 default=[1] * len(tokens), required=False))
        eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id", path)
        bos = _gguf_field(reader, "tokenizer.ggml.bos_token_id", path, required=False)
        self.sha256 = file_sha256(path)
        self.name = f"gguf:{os.path.basename(path)}"
        if model == "llama":
            scores = list(_gguf_field(reader, "tokenizer.ggml.scores", path))
            add_prefix = bool(_gguf_field(reader, "tokenizer.ggml.add_space_prefix", path,
                                          default=True, required=False))
            unk = _gguf_field(reader, "tokenizer.ggml.unknown_token_id", path, default=0,
                              required=False)
            proto = _sentencepiece_proto(tokens, scores, types, unk=unk, bos=bos, eos=eos,
                                         add_dummy_prefix=add_prefix)
            self._impl = SentencePieceTokenizer(path, model_proto=proto, sha256=self.sha256)
        elif model == "gpt2":
            merges = list(_gguf_field(reader, "tokenizer.ggml.merges", path))
            pre = _gguf_field(reader, "tokenizer.ggml.pre", path, default="default",
                              required=False)
            tok = _byte_level_bpe(tokens, merges, types, pre, path)
            self._impl = HuggingFaceTokenizer(path, _tokenizer=tok, _sha256=self.sha256,
                                              eos_token=tokens[int(eos)], _name=self.name)
        else:
            raise ValueError(f"{path}: GGUF tokenizer model {model!r} is not supported "
                             "(supported: 'llama', 'gpt2')")
        self.model = model
        self.vocab_size = len(tokens)
        self.eos_id = int(eos)
        self.bos_id = None if bos is None else int(bos)

    def encode(self, text: str) -> list[int]:
        return self._impl.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._impl.encode_batch(texts)

    def decode(self, ids: Sequence[int]) -> str:
        return self._impl.decode(ids)


def _sentencepiece_proto(tokens, scores, types, *, unk, bos, eos, add_dummy_prefix) -> bytes:
    """A serialized SentencePiece BPE ``ModelProto`` with the given pieces."""
    from sentencepiece import sentencepiece_model_pb2 as sp_pb2

    proto = sp_pb2.ModelProto()
    spec = proto.trainer_spec
    spec.model_type = sp_pb2.TrainerSpec.BPE
    spec.vocab_size = len(tokens)
    spec.byte_fallback = any(int(t) == _GGUF_BYTE for t in types)
    spec.unk_id = int(unk)
    spec.bos_id = -1 if bos is None else int(bos)
    spec.eos_id = int(eos)
    spec.pad_id = -1
    spec.unk_piece, spec.eos_piece = tokens[int(unk)], tokens[int(eos)]
    if bos is not None:
        spec.bos_piece = tokens[int(bos)]
    norm = proto.normalizer_spec
    norm.name = "identity"
    norm.add_dummy_prefix = add_dummy_prefix
    norm.remove_extra_whitespaces = False
    norm.escape_whitespaces = True
    for token, score, kind in zip(tokens, scores, types):
        piece = proto.pieces.add()
        piece.piece = token
        piece.score = float(score)
        piece.type = int(kind)
    return proto.SerializeToString()


def _byte_level_bpe(tokens, merges, types, pre: str, path: str):
    """A ``tokenizers.Tokenizer`` for a GPT-2-style byte-level BPE vocabulary."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _GPT2_PRE:
        pre_tokenizer = byte_level
    elif pre in _DIGITS_GPT2_PRE:
        pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        raise ValueError(f"{path}: GGUF pre-tokenizer tokenizer.ggml.pre={pre!r} is not "
                         f"supported (supported: {', '.join(_GPT2_PRE + _DIGITS_GPT2_PRE)})")
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    specials = [tokenizers.AddedToken(t, special=int(k) == _GGUF_CONTROL, normalized=False)
                for t, k in zip(tokens, types) if int(k) in (_GGUF_CONTROL, _GGUF_USER_DEFINED)]
    tok.add_tokens(specials)
    return tok


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids ``0..255``, EOS ``256``, ``vocab_size == 257``, no BOS."""

    kind = "byte"

    def __init__(self):
        self.name = "byte"
        self.path = None
        self.sha256 = hashlib.sha256(b"byte").hexdigest()
        self.vocab_size = 257
        self.eos_id = 256
        self.bos_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Decodes the byte ids; EOS is dropped, invalid UTF-8 becomes U+FFFD.

        Raises:
            ValueError: an id is outside ``[0, 257)``.
        """
        data = bytearray()
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                continue
            if not 0 <= i < 256:
                raise ValueError(f"byte tokenizer: id {i} is outside [0, {self.vocab_size})")
            data.append(i)
        return data.decode("utf-8", errors="replace")


def make_tokenizer(kind: str, path: str | None = None) -> Tokenizer:
    """Builds a tokenizer by kind.

    Args:
        kind: one of ``KINDS``: ``"sentencepiece"``, ``"huggingface"``, ``"gguf"`` or ``"byte"``.
        path: the model file. ``None`` with ``"sentencepiece"`` selects the bundled LLaMA-2 model;
            required for ``"huggingface"`` (a ``tokenizer.json``) and ``"gguf"`` (a ``.gguf``);
            must be ``None`` for ``"byte"``.

    Returns:
        The tokenizer.

    Raises:
        ValueError: unknown ``kind``, a ``path`` given for ``"byte"`` or missing for the others,
            or a file that is not of the expected kind.
        FileNotFoundError: the model file does not exist.
    """
    if kind == "byte":
        if path is not None:
            raise ValueError(f"the byte tokenizer takes no model file, got path={path!r}")
        return ByteTokenizer()
    if kind == "sentencepiece":
        if path is None:
            path = assets.asset_path(assets.LLAMA2_TOKENIZER)
        return SentencePieceTokenizer(path)
    if kind in ("huggingface", "gguf"):
        if path is None:
            raise ValueError(f"the {kind} tokenizer needs a model file (tokenizer_path)")
        return HuggingFaceTokenizer(path) if kind == "huggingface" else GGUFTokenizer(path)
    raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {', '.join(KINDS)}")
