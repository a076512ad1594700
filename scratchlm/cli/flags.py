"""Config fields as command-line flags: `scratchlm train` takes every TrainConfig and GPTConfig
field, `walkthrough` and `inspect` the GPTConfig ones (the model variants)."""

from __future__ import annotations

import argparse


def parse_field_value(kind: str, optional: bool):
    """The argparse type of a field: int, float or str, and `none` for an optional one."""
    def parse(text: str):
        if optional and text.lower() == "none":
            return None
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        return text

    parse.__name__ = kind  # argparse names the type in its error message
    return parse


def add_field_flags(group, fields, dest_prefix=lambda f: "model." if f.model else "train.") -> None:
    """One flag per CliField in `group`: --name VALUE, or --name / --no-name for a bool; a flag
    not given leaves no attribute (argparse.SUPPRESS), so only what the user typed overrides."""
    for f in fields:
        help_text = f"{f.doc} (default: {f.default})".replace("%", "%%")
        dest = dest_prefix(f) + f.name
        if f.kind == "bool":
            group.add_argument(f"--{f.name}", dest=dest, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
        else:
            group.add_argument(f"--{f.name}", dest=dest, type=parse_field_value(f.kind, f.optional),
                               default=argparse.SUPPRESS, metavar=f.kind.upper(), help=help_text)


def add_model_flags(parser, note: str, skip: tuple[str, ...] = (), preset: str | None = None) -> None:
    """GPTConfig's fields (vocab_size and `skip` aside) as flags on a command that builds a model
    from a preset; with `preset` (the command's default one), the defaults shown are its values."""
    import dataclasses

    from scratchlm.model.config import GPTConfig
    from scratchlm.training.train_config import cli_fields

    group = parser.add_argument_group(f"model fields (GPTConfig), changing the preset's: {note}")
    fields = [f for f in cli_fields() if f.model and f.name not in skip]
    if preset is not None:
        values = GPTConfig.from_name(preset)
        fields = [dataclasses.replace(f, default=f"{getattr(values, f.name)}, the {preset} preset's") for f in fields]
    add_field_flags(group, fields)


def model_overrides(args) -> dict:
    """The model fields given on the command line, by add_model_flags."""
    return {k[len("model."):]: v for k, v in vars(args).items() if k.startswith("model.")}


def add_generation_flags(p) -> None:
    """One flag per field of the generation records (GenerationSettings, SamplingOptions), with the
    help written under the field; --stop repeats, and understands \\n and \\t."""
    from scratchlm.generation.settings import generation_fields

    group = p.add_argument_group("generation settings (GenerationSettings, SamplingOptions)")
    for f in generation_fields():
        flag = "--" + f.name.replace("_", "-")
        if f.name == "stop":
            group.add_argument(flag, action="append", default=[], metavar="TEXT",
                               help=f"{f.doc} Repeatable; \\n and \\t are understood.".replace("%", "%%"))
        elif f.kind == "bool":
            group.add_argument(flag, action="store_true", help=f.doc.replace("%", "%%"))
        else:
            shown = "off" if f.default is None else f.default
            group.add_argument(flag, type={"int": int, "float": float}[f.kind], default=f.default,
                               metavar=f.kind.upper(), help=f"{f.doc} (default: {shown})".replace("%", "%%"))
