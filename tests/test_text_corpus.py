"""The built-in corpus (scratchlm/text/corpus.py): Project Gutenberg's Markdown plays turned into
`SPEAKER:` blocks, by hand and over all 38 files."""

from __future__ import annotations

from scratchlm.text.corpus import markdown_play_to_text, shakespeare_documents, shakespeare_files


PLAY_MD = """# A Play

## ACT I

### SCENE I. A street.

_Enter ROMEO and
JULIET_

**ROMEO**  
But soft, what light  
_\\[Aside]_  
through yonder window breaks?

*Exit Juliet, and 
returns.*

It is the east.

**JULIET**  
[Within]_  
Ay me! _\\[sighs]_ &amp; more\\--  

### SCENE II. Elsewhere.

**FIRST WATCH**  
Stand!
"""

PLAY_TEXT = """ROMEO:
But soft, what light
through yonder window breaks?
It is the east.

JULIET:
Ay me! sighs & more--

FIRST WATCH:
Stand!
"""


def test_markdown_play_to_text_by_hand():
    assert markdown_play_to_text(PLAY_MD) == PLAY_TEXT


def test_builtin_shakespeare_corpus():
    files = shakespeare_files()
    assert len(files) == 38 and all(f.suffix == ".md" for f in files)
    texts = [text for _, text in shakespeare_documents()]
    whole = "".join(texts)
    assert 4_000_000 < len(whole.encode()) < 5_500_000
    for marker in ("**", "_", "\\", "#", "&amp;"):
        assert marker not in whole, marker
    assert "To be, or not to be" in whole
    # nearly every block is `SPEAKER:` then lines (a few dozen source quirks, like a bare "SONG.", are not)
    blocks = [b.split("\n") for text in texts for b in text.split("\n\n")]
    spoken = [b for b in blocks if b[0].endswith(":") and len(b[0]) < 40 and len(b) >= 2]
    assert len(blocks) > 30_000 and len(spoken) / len(blocks) > 0.998
