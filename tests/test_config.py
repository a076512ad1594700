"""GPTConfig validation, presets by name, and the first `scratchlm inspect` command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scratchlm.errors import ConfigError, UserError
from scratchlm.model.config import GPTConfig

SIZE_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "n_inner")


def check_refused(field: str, **values) -> ConfigError:
    with pytest.raises(ValueError) as info:
        GPTConfig(**values)
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, UserError)
    assert err.field == field
    assert str(err).startswith(f"{field}:"), str(err)
    return err


@pytest.mark.parametrize("field", SIZE_FIELDS)
@pytest.mark.parametrize("bad", [0, -4])
def test_zero_or_negative_sizes_are_refused(field, bad):
    err = check_refused(field, **{field: bad})
    assert "positive" in str(err)


@pytest.mark.parametrize(
    "field,bad",
    # None is n_inner's documented default (4 * n_embd), so it is only wrong for the others
    [(f, bad) for f in SIZE_FIELDS for bad in (2.5, "8", True, None) if not (f == "n_inner" and bad is None)],
)
def test_non_integer_sizes_are_refused(field, bad):
    err = check_refused(field, **{field: bad})
    assert "whole number" in str(err)


def test_n_embd_not_divisible_by_n_head():
    err = check_refused("n_embd", n_embd=130, n_head=4)
    assert "130" in str(err) and "n_head=4" in str(err) and "divisible" in str(err)


@pytest.mark.parametrize(
    "field,bad",
    [
        ("pos_embedding", "alibi"),
        ("norm", "batchnorm"),
        ("activation", "tanh"),
        ("norm_position", "middle"),
        ("init", "kaiming"),
    ],
)
def test_unknown_variant_names_are_refused(field, bad):
    err = check_refused(field, **{field: bad})
    assert repr(bad) in str(err)
    # the message lists the allowed values, so the user can pick one
    allowed = {
        "pos_embedding": "rope",
        "norm": "rmsnorm",
        "activation": "swiglu",
        "norm_position": "post",
        "init": "xavier",
    }[field]
    assert allowed in str(err)


def test_swiglu_with_odd_hidden_size_is_refused():
    err = check_refused("n_inner", activation="swiglu", n_inner=33)
    assert "33" in str(err) and "odd" in str(err)
    GPTConfig(activation="swiglu", n_inner=34)  # even is fine
    GPTConfig(activation="relu", n_inner=33)  # odd is fine without the split


def test_rope_with_odd_head_size_is_refused():
    err = check_refused("n_head", pos_embedding="rope", n_embd=12, n_head=4)  # head size 3
    assert "3" in str(err) and "odd" in str(err)
    GPTConfig(pos_embedding="learned", n_embd=12, n_head=4)  # fine without rope
    GPTConfig(pos_embedding="rope", n_embd=12, n_head=3)  # head size 4


@pytest.mark.parametrize(
    "field,bad",
    [
        ("dropout", 1.0),
        ("dropout", -0.1),
        ("norm_eps", 0.0),
        ("rope_theta", -1.0),
        ("tie_weights", "yes"),
        ("qkv_bias", 1),
        ("lm_head_bias", None),
    ],
)
def test_other_fields_are_checked(field, bad):
    check_refused(field, **{field: bad})


def test_unknown_preset_is_refused_naming_the_choices():
    with pytest.raises(ValueError) as info:
        GPTConfig.from_name("gpt5")
    assert isinstance(info.value, ConfigError)
    assert info.value.field == "preset"
    assert "'gpt5'" in str(info.value) and "smoke" in str(info.value)


def test_unknown_field_in_dict_is_refused():
    with pytest.raises(ConfigError) as info:
        GPTConfig.from_dict({"n_embd": 64, "n_embed": 64})
    assert info.value.field == "n_embed"


# The sizes below are copied from the seed's table in SPEC.md, not from config.py.
@pytest.mark.parametrize(
    "name,C,H,N,context,V",
    [
        ("smoke", 128, 4, 2, 256, 50304),
        ("seed-400m", 1024, 16, 24, 1024, 50304),
        ("hand", 2, 2, 1, 3, 5),
        ("gpt2-124m", 768, 12, 12, 1024, 50257),
    ],
)
def test_presets_by_name(name, C, H, N, context, V):
    cfg = GPTConfig.from_name(name)
    assert (cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.block_size, cfg.vocab_size) == (C, H, N, context, V)


def test_smoke_is_the_seed_architecture():
    cfg = GPTConfig.from_name("smoke")
    assert (cfg.pos_embedding, cfg.norm, cfg.activation, cfg.norm_position) == ("learned", "layernorm", "relu", "pre")
    assert (cfg.qkv_bias, cfg.proj_bias, cfg.mlp_bias, cfg.lm_head_bias, cfg.tie_weights) == (False, True, True, True, False)


def test_gpt2_124m_is_gpt2():
    cfg = GPTConfig.from_name("gpt2-124m")
    assert cfg.activation == "gelu_tanh" and cfg.tie_weights and cfg.pos_embedding == "learned"
    assert (cfg.qkv_bias, cfg.proj_bias, cfg.mlp_bias, cfg.lm_head_bias) == (True, True, True, False)
    assert cfg.mlp_hidden == 4 * 768 and cfg.norm_eps == 1e-5


def test_preset_overrides_and_round_trip():
    cfg = GPTConfig.from_name("smoke", n_layer=4, activation="gelu")
    assert cfg.n_layer == 4 and cfg.activation == "gelu" and cfg.n_embd == 128
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError) as info:
        cfg.replace(n_head=3)
    assert info.value.field == "n_embd"
    with pytest.raises(ConfigError):
        GPTConfig.from_name("smoke", n_layer=0)


# ---------------------------------------------------------------- the command line


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scratchlm", *args], capture_output=True, text=True, timeout=120
    )


def test_inspect_smoke_prints_the_exact_count_and_shapes():
    result = run_cli("inspect", "--preset", "smoke")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "13,356,928" in out
    assert "(2, 16, 128)" in out and "(2, 16, 50304)" in out


def test_inspect_unknown_preset_is_one_error_line():
    result = run_cli("inspect", "--preset", "nope")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "'nope'" in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_every_multi_word_flag_of_every_command_takes_both_spellings():
    """`--max-steps` and `--max_steps` mean the same in every command (one spelling is shown in
    help): parsing either gives the same namespace as the declared one."""
    import argparse

    from scratchlm.cli.main import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    checked = 0
    for name, sub in commands.items():
        required = [a for a in sub._actions if a.required and a.option_strings]
        positional = [a for a in sub._actions if not a.option_strings and a.required and a.nargs is None]
        base = [name] + ["x"] * len(positional) + [token for a in required for token in (a.option_strings[0], "x")]
        for action in sub._actions:
            for flag in action.option_strings:
                if not flag.startswith("--") or ("-" not in flag[2:] and "_" not in flag[2:]):
                    continue
                other = "--" + (flag[2:].replace("-", "_") if "-" in flag[2:] else flag[2:].replace("_", "-"))
                if flag.startswith("--no-") and "_" in flag:  # --no-fused_loss: the other way is all hyphens
                    other = flag.replace("_", "-")
                assert other not in sub._option_string_actions  # only one spelling declared
                value = [] if action.nargs == 0 else (["1"] if action.choices is None else [str(next(iter(action.choices)))])
                declared = parser.parse_args(base + [flag, *value])
                respelled = parser.parse_args(base + [other, *value])
                with_equals = parser.parse_args(base + [f"{other}={value[0]}"]) if value else respelled
                assert vars(declared) == vars(respelled) == vars(with_equals), (name, flag)
                checked += 1
    assert checked > 40  # train alone has dozens
    help_text = commands["train"].format_help()
    assert "--max_steps" in help_text and "--max-steps" not in help_text  # one spelling in help
