"""The walkthrough's station titles say what the printed numbers are, in every configuration
(issue 33): each claim a title makes is checked here against the numbers, with NumPy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scratchlm.cli.main import main


def _walk(capsys, *flags: str) -> dict[str, dict]:
    assert main(["walkthrough", "--forward-only", "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    return {"weights": report["weights"], **{s["key"]: s for s in report["steps"]}}


def test_rope_q_and_k_say_they_are_rotated_and_are(capsys):
    """Issue 33's Must show. Rotation keeps each row's length and leaves position 0 alone; the
    unrotated ln_1(x) W^T differs at the later positions."""
    walk = _walk(capsys, "--pos_embedding", "rope", "--n_head", "1")
    ln_1 = np.array(walk["h0.ln_1"]["torch"])
    for key, weight in (("h0.q", "W_Q"), ("h0.k", "W_K")):
        assert "rotated by position (RoPE)" in walk[key]["title"]
        printed = np.array(walk[key]["torch"])[0]  # (T, hs), the only head
        plain = ln_1 @ np.array(walk["weights"][f"transformer.h.0.attn.{weight}"]).T
        np.testing.assert_allclose(printed[0], plain[0], atol=1e-12)
        np.testing.assert_allclose(np.linalg.norm(printed, axis=1), np.linalg.norm(plain, axis=1), atol=1e-12)
        assert not np.allclose(printed[1:], plain[1:])
    assert "zeros" in walk["pos"]["title"] and not np.any(np.array(walk["pos"]["torch"]))
    assert "wpe" not in walk["pos"]["title"]


@pytest.mark.parametrize("pos, words", [("learned", "wpe"), ("sinusoidal", "fixed (no weights)"), ("none", "zeros")])
def test_the_position_station_is_titled_by_what_it_adds(capsys, pos, words):
    walk = _walk(capsys, "--pos_embedding", pos)
    assert words in walk["pos"]["title"]
    added = np.array(walk["x0"]["torch"]) - np.array(walk["wte"]["torch"])
    np.testing.assert_allclose(np.array(walk["pos"]["torch"]), added, atol=1e-12)
    assert np.any(added) == (pos != "none")


def test_post_norm_stations_come_in_the_order_computed_and_ln_2_is_the_output(capsys):
    walk = _walk(capsys, "--norm_position", "post")
    keys = [k for k in walk if k.startswith("h0.")]
    assert keys.index("h0.resid_1") < keys.index("h0.ln_1") < keys.index("h0.mlp_pre")
    assert keys.index("h0.mlp_out") < keys.index("h0.ln_2") < keys.index("h0.out")
    # ln_2(ln_1 + MLP output), by hand: the hand init's gains are 1 and shifts 0
    s = np.array(walk["h0.ln_1"]["torch"]) + np.array(walk["h0.mlp_out"]["torch"])
    by_hand = (s - s.mean(axis=1, keepdims=True)) / np.sqrt(s.var(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.array(walk["h0.ln_2"]["torch"]), by_hand, atol=1e-9)
    np.testing.assert_allclose(np.array(walk["h0.out"]["torch"]), by_hand, atol=1e-9)
    assert "ln_2 above" in walk["h0.out"]["title"]


@pytest.mark.parametrize("flags, pre, hidden", [
    ((), ("4C", 8), ("4C", 8)),
    (("--n_inner", "6"), ("n_inner = 6", 6), ("n_inner = 6", 6)),
    (("--n_inner", "6", "--activation", "swiglu"), ("n_inner = 6", 6), ("n_inner / 2 = 3", 3)),
])
def test_the_mlp_titles_give_the_width_printed(capsys, flags, pre, hidden):
    walk = _walk(capsys, *flags)
    for key, (words, width) in (("h0.mlp_pre", pre), ("h0.mlp_hidden", hidden)):
        assert f"(T, {words})" in walk[key]["title"]
        assert np.array(walk[key]["torch"]).shape == (3, width)


def test_help_shows_the_hand_presets_values(capsys):
    with pytest.raises(SystemExit):
        main(["walkthrough", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--block_size INT" in text and "(default: 3, the hand preset's)" in text
    assert "(default: 256" not in text
