"""Tokenizers behind one small interface: LLaMA-2 SentencePiece and raw UTF-8 bytes.

The paper tokenizes with the LLaMA-2 SentencePiece model (vocabulary 32000), without BOS, and
appends EOS (id 2) after every document (spec §6). The pipeline appends EOS itself, so ``encode``
never adds BOS or EOS. ``ByteTokenizer`` is a dependency-free tokenizer for tests and tiny runs.
"""

import abc
import os
from collections.abc import Sequence

import sentencepiece as spm

from lattn_jax import assets

__all__ = ["ByteTokenizer", "SentencePieceTokenizer", "Tokenizer", "make_tokenizer"]


class Tokenizer(abc.ABC):
    """Text <-> token ids. ``encode`` adds no special tokens (no BOS, no EOS).

    Attributes:
        name: short identifier, e.g. ``"sentencepiece:tokenizer.model"`` or ``"byte"``.
        vocab_size: number of ids; every id is in ``[0, vocab_size)``.
        eos_id: id appended after every document by the pipeline.
        bos_id: id of the BOS token, or ``None`` if the tokenizer has none. The pipeline never
            emits it.
    """

    name: str
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

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, "
                f"eos_id={self.eos_id}, bos_id={self.bos_id})")


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model, e.g. the LLaMA-2 ``tokenizer.model`` (vocab 32000, BOS 1, EOS 2).

    Args:
        path: the ``.model`` file (serialized ``ModelProto``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the model has no EOS piece.
    """

    def __init__(self, path: str):
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"SentencePiece model not found: {path}")
        self._path = path
        self._sp = spm.SentencePieceProcessor(model_file=path)
        self.name = f"sentencepiece:{os.path.basename(path)}"
        self.vocab_size = int(self._sp.get_piece_size())
        self.eos_id = int(self._sp.eos_id())
        if self.eos_id < 0:
            raise ValueError(f"SentencePiece model {path} defines no EOS piece")
        bos = int(self._sp.bos_id())
        self.bos_id = bos if bos >= 0 else None

    @property
    def path(self) -> str:
        """The model file this tokenizer was loaded from."""
        return self._path

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int, add_bos=False, add_eos=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # One call into the C++ library (it parallelises over texts internally).
        return self._sp.encode(list(texts), out_type=int, add_bos=False, add_eos=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids ``0..255``, EOS ``256``, ``vocab_size == 257``, no BOS."""

    def __init__(self):
        self.name = "byte"
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
    """Builds a tokenizer by name.

    Args:
        kind: ``"sentencepiece"`` or ``"byte"``.
        path: the SentencePiece model; ``None`` selects the bundled LLaMA-2 model. Must be ``None``
            for ``"byte"``.

    Returns:
        The tokenizer.

    Raises:
        ValueError: unknown ``kind``, or a ``path`` given for ``"byte"``.
        FileNotFoundError: the SentencePiece model file does not exist.
    """
    if kind == "byte":
        if path is not None:
            raise ValueError(f"the byte tokenizer takes no model file, got path={path!r}")
        return ByteTokenizer()
    if kind == "sentencepiece":
        if path is None:
            path = assets.asset_path(assets.LLAMA2_TOKENIZER)
        return SentencePieceTokenizer(path)
    raise ValueError(f"unknown tokenizer kind {kind!r}; expected 'sentencepiece' or 'byte'")
