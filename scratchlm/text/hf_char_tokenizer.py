"""scratchlm's char tokenizer as a Hugging Face `tokenizers` file, and back, with the same ids.

Out (export-hf): a WordLevel vocabulary of the characters and the special tokens at the
tokenizer's own ids, a Split pre-tokenizer that makes every character its own piece, and a Fuse
decoder that glues the pieces. In (import-hf, train --init_from a Hugging Face folder): such a
tokenizer.json read back with the file's ids exactly, in whatever order they come and with
whatever gaps (an id no piece holds is never encoded to and decodes to nothing, in transformers
as here). What scratchlm's char tokenizer would encode differently from transformers (a
normalizer, another pre-tokenizer, a piece longer than one character that is not a special token)
is refused with one line rather than read approximately.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scratchlm.errors import UserError
from scratchlm.text.tokenizer import CharTokenizer

# the pre-tokenizer char_tokenizer_for_hf writes, as tokenizer.json spells it
_CHAR_SPLIT = {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated", "invert": False}


def char_tokenizer_for_hf(tokenizer: CharTokenizer) -> Any:
    """A `tokenizers` Tokenizer that encodes and decodes as `tokenizer` does: every character its
    own piece (a Split pre-tokenizer), looked up in a WordLevel vocabulary of the characters and
    the special tokens at their ids; decoding glues the pieces (Fuse). A character outside the
    alphabet is an error there as here (or <unk>, where the tokenizer has one)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = tokenizer.piece_ids()
    specials = [piece for piece in vocab if len(piece) > 1]
    unk = tokenizer.decode([tokenizer.unk_id]) if tokenizer.unk_id is not None else None
    hf_tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    hf_tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    hf_tok.decoder = decoders.Fuse()
    hf_tok.add_special_tokens([AddedToken(piece, special=True, normalized=False) for piece in specials])
    return hf_tok


def char_tokenizer_from_hf(spec: dict, directory: Path) -> CharTokenizer:
    """The WordLevel tokenizer.json `spec` of the Hugging Face folder `directory` as a
    CharTokenizer with the file's ids exactly; UserError, naming the file, for what it cannot hold."""
    where = directory / "tokenizer.json"

    def refuse(why: str) -> UserError:
        return UserError(f"{where}: {why}; scratchlm's char tokenizer would encode text otherwise than "
                         "transformers, so it is not imported")

    if spec.get("normalizer") is not None:
        raise refuse(f"it has a normalizer ({json.dumps(spec['normalizer'])[:80]})")
    if spec.get("pre_tokenizer") != _CHAR_SPLIT:
        raise refuse("its pre-tokenizer does not make every character its own piece")
    vocab = spec["model"].get("vocab")
    if not isinstance(vocab, dict):
        raise UserError(f"{where}: the WordLevel model has no vocab object")
    ids = dict(vocab)
    for token in spec.get("added_tokens", []):  # transformers gives an added token the id listed here
        content, i = token.get("content"), token.get("id")
        if ids.setdefault(content, i) != i:
            raise refuse(f"{content!r} has id {ids[content]} in the vocabulary but {i} among the added tokens")
    unk = spec["model"].get("unk_token")
    try:  # tokenizers writes unk_token "<unk>" even for a vocabulary without one: then unknowns are an error
        tok = CharTokenizer.from_ids(ids, unk if unk in ids else None)
    except UserError as exc:
        raise refuse(str(exc)) from None
    rows = _model_vocab_size(directory)
    if rows is not None and tok.vocab_size > rows:
        raise UserError(f"{where}: ids run to {tok.vocab_size - 1}, but the model has {rows} rows (vocab_size in "
                        "config.json); tokenizer and model do not belong together")
    return tok


def _model_vocab_size(directory: Path) -> int | None:
    """vocab_size from the folder's config.json; None when it names none."""
    try:
        value = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
