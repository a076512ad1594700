"""Attention maps: each layer's attention weights for a prompt, token labels to read them by,
a font that covers the labels' scripts, and the heatmap figure (`scratchlm attention`).
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from scratchlm.fileio import atomic_write
from scratchlm.model.gpt import GPT, eval_mode

# families that cover Chinese (and Japanese/Korean) ideographs, most wanted first
_CJK_FAMILIES = (
    "Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC",
    "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Droid Sans Fallback", "Microsoft YaHei", "SimHei",
    "PingFang SC", "Hiragino Sans GB", "Noto Serif CJK SC", "AR PL UMing CN",
)
_CJK_FILE_HINTS = ("cjk", "wqy", "wenquanyi", "droidsansfallback", "sourcehan", "yahei", "simhei", "pingfang", "uming")


@torch.no_grad()
def attention_weights(model: GPT, ids: Sequence[int]) -> list[np.ndarray]:
    """Each layer's attention weights (H, T, T) for one sequence, from the explicit path."""
    device = next(model.parameters()).device
    idx = torch.tensor([list(ids)], dtype=torch.long, device=device)  # (1, T)
    weights: list[torch.Tensor] = []
    with eval_mode(model):
        model(idx, attn_weights=weights)
    return [w[0].float().cpu().numpy() for w in weights]


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """One axis label per token: its piece of text, whitespace made visible (␣ ↵ ⇥); a byte-level
    id that holds only part of a character is labelled with the whole character and its place
    (猫[1/3], 猫[2/3], 猫[3/3]) rather than a replacement mark."""
    from scratchlm.inside.tokenize_view import piece_labels

    return [label or f"<{int(i)}>" for label, i in zip(piece_labels(tokenizer, list(ids)), ids)]


@functools.lru_cache(maxsize=None)
def _charmap(path: str) -> frozenset[int]:
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except Exception:  # an unreadable font file is just not a candidate
        return frozenset()


def _candidate_fonts() -> list[str]:
    """Font files to look in for glyphs DejaVu Sans lacks: the known CJK families first, then
    every font matplotlib or the system has (its cache may predate a newly installed package)."""
    from matplotlib import font_manager

    known = {f.name: f.fname for f in font_manager.fontManager.ttflist}
    paths = [known[name] for name in _CJK_FAMILIES if name in known]
    system = font_manager.findSystemFonts()
    paths += [p for p in system if any(h in os.path.basename(p).lower() for h in _CJK_FILE_HINTS)]
    paths += [f.fname for f in font_manager.fontManager.ttflist] + sorted(system)
    return list(dict.fromkeys(paths))


def fonts_for(text: str) -> tuple[list[str], str]:
    """Font families that together have a glyph for every character of `text`, for matplotlib's
    per-glyph fallback (the first family that has a character draws it): DejaVu Sans first, then
    for what it lacks, installed fonts in turn, so "The cat 爱 the mat。␣" takes its Latin letters
    and ␣ from DejaVu and 爱 。 from a CJK font. Returns (families, the characters no installed
    font has)."""
    from matplotlib import font_manager

    default = font_manager.findfont("DejaVu Sans", fallback_to_default=True)
    missing = {c for c in text if not c.isspace() and ord(c) not in _charmap(default)}
    families = ["DejaVu Sans"]
    for path in _candidate_fonts() if missing else []:
        found = {c for c in missing if ord(c) in _charmap(path)}
        if not found:
            continue
        font_manager.fontManager.addfont(path)
        # a .ttc holds several faces (JP, SC, ...); prefer the Chinese one when it is there
        faces = {f.name for f in font_manager.fontManager.ttflist if f.fname == path}
        preferred = [name for name in _CJK_FAMILIES if name in faces]
        name = preferred[0] if preferred else font_manager.FontProperties(fname=path).get_name()
        if name not in families:
            families.append(name)
        missing -= found
        if not missing:
            break
    return families, "".join(sorted(missing))


def find_font_for(text: str) -> str | None:
    """One family that covers every non-space character of `text` on its own, or None (kept for
    callers that draw with a single font; the figures use fonts_for)."""
    from matplotlib import font_manager

    chars = {ord(c) for c in text if not c.isspace()}
    for name in ["DejaVu Sans", *fonts_for(text)[0][1:]]:
        if chars <= _charmap(font_manager.findfont(name, fallback_to_default=True)):
            return name
    return None


def _upright(label: str) -> str:
    """A label written top to bottom, one character per line; a byte piece's place (爱[2/3]) becomes
    its number on the last line (a column is too narrow for "[2/3]"; the rows' labels keep it whole)."""
    import re

    text, place = re.fullmatch(r"(.*?)(?:\[(\d+)/\d+\])?", label, flags=re.S).groups()
    return "\n".join([*text, *([place] if place else [])])


def _is_wide(label: str) -> bool:
    """Whether a label holds CJK (or other East Asian wide) characters, which read upright."""
    import unicodedata

    return any(unicodedata.east_asian_width(c) in "WF" for c in label)


def attention_figure(weights: list[np.ndarray], labels: Sequence[str], *, layers: Sequence[int] | None = None,
                     heads: Sequence[int] | None = None, panel_inches: float = 3.0, dpi: int = 100):
    """A grid of heatmaps, one row per selected layer and one column per selected head.

    weights: per layer (H, T, T) with rows = queries, columns = keys. Returns the matplotlib
    Figure; its size is (len(heads) * panel_inches, len(layers) * panel_inches) inches at `dpi`.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    n_layer, n_head = len(weights), weights[0].shape[0]
    layers = list(range(n_layer)) if layers is None else list(layers)
    heads = list(range(n_head)) if heads is None else list(heads)
    for name, chosen, n in (("layer", layers, n_layer), ("head", heads, n_head)):
        bad = [i for i in chosen if not 0 <= i < n]
        if bad:
            raise ValueError(f"{name} {bad[0]} does not exist; the model has {n} (0..{n - 1})")
    fonts, missing = fonts_for("".join(labels))
    if missing:
        warnings.warn(f"no installed font has {', '.join(missing)}; those labels show as boxes (a CJK font: "
                      "apt-get install fonts-noto-cjk, or fonts-wqy-microhei)", stacklevel=2)
    fig = Figure(figsize=(len(heads) * panel_inches + 1.0, len(layers) * panel_inches), dpi=dpi, layout="constrained")
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    T = len(labels)
    # an x label with CJK characters is written one character per line, upright; others turn 90 degrees
    x_labels = [_upright(label) if _is_wide(label) else label for label in labels]
    image = None
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            image = ax.imshow(weights[layer][head], vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_title(f"layer {layer}, head {head}", fontsize=9)
            ax.set_xticks(range(T), x_labels, fontfamily=fonts, fontsize=8)
            for tick, label in zip(ax.get_xticklabels(), labels):
                tick.set_rotation(0 if _is_wide(label) else 90)
            ax.set_yticks(range(T), labels, fontfamily=fonts, fontsize=8)
            if c == 0:
                ax.set_ylabel("query (row)", fontsize=8)
            if r == len(layers) - 1:
                ax.set_xlabel("key (column)", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    return fig


def save_figure(fig, out: str | os.PathLike) -> Path:
    """Write the figure as PNG, whole or not at all (scratchlm.fileio.atomic_write)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out) as f, warnings.catch_warnings():
        # attention_figure already warned once if a glyph is missing; don't repeat per label
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        fig.savefig(f, format="png", dpi=fig.dpi)
    return out
