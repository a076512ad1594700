"""A scratchlm tokenizer in the form llama.cpp loads it from a GGUF file, encoding as scratchlm does.

llama.cpp has its own tokenizers, chosen by `tokenizer.ggml.model`; the vocabulary is written for
the one that splits text the way scratchlm's tokenizer does:

- `char` -> `t5` (llama.cpp's unigram tokenizer, UGM). Every character of the vocabulary is a
  token of score 0; the unigram search can only spell a text one character at a time, as
  scratchlm does. It is the one llama.cpp tokenizer that maps a character it does not know to an
  unknown-token id; its SentencePiece sibling (`llama`) looks for byte tokens `<0xE4>` instead and
  stops the program with `std::out_of_range` when there are none. The unknown id is the
  tokenizer's `<unk>` (prepare --char-unk); a tokenizer without one maps such characters to
  `<|endoftext|>`, the id a model has learned as "another text begins here". One difference
  stays: llama.cpp gives a run of unknown characters one id, scratchlm one id each. The unigram
  tokenizer spells a space U+2581 (as SentencePiece does), so the space's token is written that
  way, and a vocabulary holding U+2581 itself is refused (a U+2581 typed into a prompt reads as
  a space in llama.cpp).
- `bpe` and `gpt2` -> `gpt2` with the `gpt-2` pre-tokenizer: byte-level BPE, its vocabulary and
  merges as Hugging Face's tokenizer.json holds them, split by GPT-2's pattern first.

In every form, <|bos|> and <|endoftext|> (and a fine-tuned run's chat tokens) are control tokens (llama.cpp's tokenize with
special=False keeps them typed text, as scratchlm does; llama-cpp-python's create_completion
tokenizes with special=True and reads them as the tokens), no BOS or EOS is added around a text,
and ids no piece holds (a char vocabulary read with gaps) are written as unused placeholders. A
char vocabulary holding NUL is refused: llama.cpp's unigram tokenizer never matches it.

A fine-tuned run's vocabulary (one with the chat tokens) also carries its template,
`tokenizer.chat_template` (scratchlm.text.chat.jinja_template), and <|end|> as the end-of-turn
token, so llama.cpp's chat completion renders the prompt scratchlm renders and stops where a
reply ends.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchlm.errors import UserError
from scratchlm.text.chat import END_TOKEN, has_chat_tokens, jinja_template

SPACE_MARK = "\u2581"  # how llama.cpp's unigram tokenizer spells a space inside its vocabulary
NORMAL, UNKNOWN, CONTROL, UNUSED = 1, 2, 3, 5  # llama.cpp's token types (gguf.TokenType)


@dataclass
class GGUFVocab:
    """What `tokenizer.ggml.*` holds: the pieces by id, their types and scores, merges for BPE."""

    model: str
    tokens: list[str]
    types: list[int]
    bos_id: int
    eos_id: int
    unk_id: int | None = None
    pre: str | None = None
    merges: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    chat_end_id: int | None = None
    """<|end|>'s id for a vocabulary with the chat template; None without one."""

    def write(self, writer: Any) -> None:
        """Add the tokenizer keys to a gguf.GGUFWriter."""
        writer.add_tokenizer_model(self.model)
        if self.pre is not None:
            writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.types)
        writer.add_token_scores([0.0 if t == NORMAL else -1e9 for t in self.types])
        if self.merges:
            writer.add_token_merges(self.merges)
        writer.add_bos_token_id(self.bos_id)
        writer.add_eos_token_id(self.eos_id)
        writer.add_pad_token_id(self.eos_id)
        if self.unk_id is not None:
            writer.add_unk_token_id(self.unk_id)
        if self.chat_end_id is not None:
            writer.add_chat_template(jinja_template())
            writer.add_eot_token_id(self.chat_end_id)  # llama.cpp ends a reply there
        writer.add_add_bos_token(False)  # scratchlm adds nothing around a prompt
        writer.add_add_eos_token(False)
        writer.add_add_space_prefix(False)
        writer.add_remove_extra_whitespaces(False)


def gguf_vocab(tokenizer: Any) -> GGUFVocab:
    """The GGUF form of a char, bpe or gpt2 tokenizer; a UserError for one llama.cpp cannot run."""
    kind = getattr(tokenizer, "kind", None)
    if kind in ("char", "bpe", "gpt2"):
        vocab = _char_vocab(tokenizer) if kind == "char" else _byte_level_vocab(tokenizer)
        for spelling, i in tokenizer.specials.items():  # GPT-2's rank file spells none past <|endoftext|>
            if vocab.types[i] != UNKNOWN:  # <unk> stays the unknown token
                vocab.tokens[i], vocab.types[i] = spelling, CONTROL
        if has_chat_tokens(tokenizer):
            vocab.chat_end_id = tokenizer.specials[END_TOKEN]
        return vocab
    if tokenizer is None:
        raise UserError("the checkpoint has no tokenizer, and llama.cpp needs one inside the GGUF file; export a run "
                        "that was trained with one (every `scratchlm train` run has)")
    raise UserError(f"a {kind!r} tokenizer has no form llama.cpp loads; GGUF export takes char, bpe and gpt2 tokenizers")


def _placeholders(pieces: dict[int, str], size: int) -> tuple[list[str], list[int]]:
    """The pieces in id order, an unused placeholder where an id has none."""
    tokens = [pieces.get(i, f"[UNUSED{i}]") for i in range(size)]
    types = [NORMAL if i in pieces else UNUSED for i in range(size)]
    return tokens, types


def _char_vocab(tokenizer: Any) -> GGUFVocab:
    pieces = {i: piece for piece, i in tokenizer.piece_ids().items()}
    if any(SPACE_MARK in piece for piece in pieces.values()):
        raise UserError(f"the vocabulary holds the character U+2581 ({SPACE_MARK}), which llama.cpp's tokenizer uses to "
                        "spell a space, so the two could not be told apart; train the tokenizer on text without it")
    if "\x00" in pieces.values():
        raise UserError("the vocabulary holds the character NUL (U+0000), which llama.cpp's tokenizer never matches "
                        "(it would read it as unknown); train the tokenizer on text without it")
    tokens, types = _placeholders({i: p.replace(" ", SPACE_MARK) for i, p in pieces.items()}, tokenizer.vocab_size)
    for i in (tokenizer.bos_id, tokenizer.eos_id):
        types[i] = CONTROL
    notes = []
    if tokenizer.unk_id is not None:
        types[tokenizer.unk_id] = UNKNOWN
        unk_id = tokenizer.unk_id
    else:
        unk_id = tokenizer.eos_id
        notes.append("the char tokenizer has no <unk>: in llama.cpp a character outside its vocabulary becomes "
                     "<|endoftext|> (scratchlm refuses such text; prepare --char-unk gives them an id of their own)")
    return GGUFVocab("t5", tokens, types, tokenizer.bos_id, tokenizer.eos_id, unk_id=unk_id, notes=notes)


def _byte_level_vocab(tokenizer: Any) -> GGUFVocab:
    from tokenizers import Tokenizer

    from scratchlm.hf.interop import gpt2_tokenizer_from_ranks

    with tempfile.TemporaryDirectory() as saved:
        tokenizer.save(saved)  # the tokenizer's own public format
        if tokenizer.kind == "gpt2":
            hf_tok, _, merge_pairs = gpt2_tokenizer_from_ranks(Path(saved) / "gpt2.tiktoken")
        else:
            hf_tok = Tokenizer.from_file(str(Path(saved) / "tokenizer.json"))
            merge_pairs = _bpe_merges(json.loads(hf_tok.to_str()), tokenizer.cut_rule == "gpt2")
    pieces = {i: piece for piece, i in hf_tok.get_vocab(with_added_tokens=True).items()}
    tokens, types = _placeholders(pieces, tokenizer.vocab_size)
    for i in getattr(tokenizer, "special_ids", ()) | {tokenizer.bos_id, tokenizer.eos_id}:
        types[i] = CONTROL
    return GGUFVocab("gpt2", tokens, types, tokenizer.bos_id, tokenizer.eos_id, pre="gpt-2",
                     merges=[f"{a} {b}" for a, b in merge_pairs])


def _bpe_merges(spec: dict, gpt2_split: bool) -> list[tuple[str, str]]:
    """The merges of a byte-level BPE tokenizer.json; gpt2_split: it splits text as GPT-2 does
    (BPETokenizer.cut_rule says so). A UserError for one that llama.cpp's gpt-2 pre-tokenizer
    would split otherwise."""
    model = spec.get("model") or {}
    plain = (gpt2_split and model.get("type") == "BPE" and not model.get("dropout")
             and not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix")
             and not model.get("byte_fallback"))
    if not plain:
        raise UserError("this BPE tokenizer does not split text the way GPT-2's byte-level BPE does (a normalizer, "
                        "another pre-tokenizer or BPE options), and llama.cpp would encode text otherwise; export a "
                        "run whose tokenizer scratchlm trained")
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in model.get("merges", [])]
