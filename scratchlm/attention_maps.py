"""Attention maps: each layer's attention weights for a prompt, token labels to read them by,
a font that covers the labels' scripts, and the heatmap figure (`scratchlm attention`).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from scratchlm.fileio import atomic_write
from scratchlm.model import GPT, eval_mode

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
    """One axis label per token: each id decoded on its own, whitespace made visible."""
    labels = []
    for i in ids:
        try:
            text = tokenizer.decode([int(i)])
        except Exception:  # a byte-level piece alone may not be valid text
            text = f"<{int(i)}>"
        text = text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
        labels.append(text or f"<{int(i)}>")
    return labels


def _font_covers(path: str, chars: set[str]) -> bool:
    from matplotlib.ft2font import FT2Font

    try:
        charmap = FT2Font(path).get_charmap()
    except Exception:  # an unreadable font file is just not a candidate
        return False
    return all(ord(c) in charmap for c in chars)


def find_font_for(text: str) -> str | None:
    """A font family whose glyphs cover every non-ASCII character of `text`: matplotlib's default
    (DejaVu Sans) when it does, else an installed CJK font. None when no installed font does.

    Looks at the fonts matplotlib knows and, since its font cache may predate a newly installed
    package, at the font files on the system, registering a match with matplotlib.
    """
    from matplotlib import font_manager

    chars = {c for c in text if ord(c) > 127}
    default = font_manager.findfont("DejaVu Sans", fallback_to_default=True)
    if _font_covers(default, chars):
        return "DejaVu Sans"
    known = {f.name: f.fname for f in font_manager.fontManager.ttflist}
    candidates = [known[name] for name in _CJK_FAMILIES if name in known]
    candidates += [f.fname for f in font_manager.fontManager.ttflist if any(h in f.fname.lower() for h in _CJK_FILE_HINTS)]
    candidates += [p for p in font_manager.findSystemFonts() if any(h in os.path.basename(p).lower() for h in _CJK_FILE_HINTS)]
    for path in dict.fromkeys(candidates):
        if _font_covers(path, chars):
            font_manager.fontManager.addfont(path)
            # a .ttc holds several faces (JP, SC, ...); prefer the Chinese one when it is there
            faces = {f.name for f in font_manager.fontManager.ttflist if f.fname == path}
            preferred = [name for name in _CJK_FAMILIES if name in faces]
            return preferred[0] if preferred else font_manager.FontProperties(fname=path).get_name()
    return None


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
    family = find_font_for("".join(labels))
    missing_glyphs = family is None
    if missing_glyphs:
        warnings.warn(
            "no installed font has glyphs for every token label; some labels will show as boxes "
            "(install a CJK font, e.g. `apt-get install fonts-noto-cjk`)",
            stacklevel=2,
        )
        family = "DejaVu Sans"
    fonts = list(dict.fromkeys([family, "DejaVu Sans"]))  # per-glyph fallback for the symbols
    fig = Figure(figsize=(len(heads) * panel_inches, len(layers) * panel_inches), dpi=dpi)
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    T = len(labels)
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            ax.imshow(weights[layer][head], vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_title(f"layer {layer}, head {head}", fontsize=9)
            ax.set_xticks(range(T), labels, fontfamily=fonts, fontsize=8, rotation=90)
            ax.set_yticks(range(T), labels, fontfamily=fonts, fontsize=8)
            if c == 0:
                ax.set_ylabel("query (row)", fontsize=8)
            if r == len(layers) - 1:
                ax.set_xlabel("key (column)", fontsize=8)
    with warnings.catch_warnings():
        if missing_glyphs:  # already said once above; layout measures every label again
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        fig.tight_layout()
    return fig


def save_figure(fig, out: str | os.PathLike) -> Path:
    """Write the figure as PNG, whole or not at all (scratchlm.fileio.atomic_write)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out) as f, warnings.catch_warnings():
        # find_font_for already warned once if a glyph is missing; don't repeat per label
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        fig.savefig(f, format="png", dpi=fig.dpi)
    return out
