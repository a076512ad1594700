"""Training settings: `TrainConfig`, the training presets, and the fields `scratchlm train` exposes.

Kept apart from `scratchlm.training.train` because it needs no torch: the command-line parser reads these
fields to build its flags, and `scratchlm prepare` or `--help` should not wait for torch to import.
`scratchlm.training.train` re-exports everything here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from scratchlm.errors import ConfigError, UserError
from scratchlm.model.config import GPTConfig
from scratchlm.records import setting_fields
from scratchlm.text.chat import TRAIN_ON

LR_SCHEDULES = ("cosine", "linear", "constant")
WINDOWS = ("anywhere", "lines")
STAGES = ("pretrain", "sft")
PRETRAIN_ONLY = ("tokenizer", "vocab_size", "tokenizer_file", "windows", "eval_iters", "full_eval_windows")
"""Fields the sft stage has no use for: its tokenizer is the source's, its batches are whole
conversations, and it evaluates every held-out one."""
SOURCE_MAY_CHANGE = ("dropout", "block_size")
"""The model fields a run started --init_from a model may set: its dropout, and its context length
where positions are computed rather than learned (a learned table has its rows)."""
DTYPES = ("float32", "bfloat16", "float16", "auto")
OPTIMIZERS = ("adamw", "muon")


@dataclass
class TrainConfig:
    """Everything that defines a training run. Saved inside every checkpoint (as "train")."""

    # --- model ---
    model: str = "smoke"
    """Model preset name (see scratchlm.model.config.PRESETS); its fields can be changed with model_overrides."""
    model_overrides: dict[str, Any] = field(default_factory=dict)
    """GPTConfig fields to change from the preset (on the command line: --n_layer 6, --block_size 64 ...).
    vocab_size is not among them: the model's vocabulary is the tokenizer's."""
    pad_vocab_multiple: int = 1
    """Round the model's vocab_size up to a multiple of this (64 makes GPU matmuls faster); 1 keeps it."""

    # --- data and tokenizer ---
    data: str = "shakespeare"
    """Training text: `shakespeare` or `tang` (built-in corpora: Shakespeare's plays, the Tang poems;
    `tang-traditional` keeps the poems' traditional characters) or a path to a text file or a folder of them."""
    tokenizer: str = "char"
    """Tokenizer kind: `char`, `bpe` (trained on the data) or `gpt2`."""
    vocab_size: int | None = None
    """Size of a `bpe` tokenizer to train (None: the data module's default)."""
    tokenizer_file: str | None = None
    """A saved tokenizer to use instead of training one."""
    val_fraction: float = 0.1
    """Share of the data held out for validation."""
    errors: str = "strict"
    """Bytes that are not UTF-8 in the text: `strict` stops with the file and byte offset, `replace` reads them as U+FFFD."""
    data_cache: str | None = None
    """Where prepared data is cached (None: ~/.cache/scratchlm/data, or $SCRATCHLM_CACHE/data)."""

    # --- optimisation ---
    batch_size: int = 12
    """B: sequences per micro-batch on each process."""
    windows: str = "anywhere"
    """Where training windows start: `anywhere` (nanoGPT's random offsets) or `lines` (only after
    a newline or BOS, so the model learns that its context begins a line: a prompt such as 床前明月光
    is then read as the start of a verse line, not the middle of one)."""
    grad_accum: int = 1
    """Micro-batches whose gradients are summed before each optimizer step."""
    max_steps: int = 2000
    """Optimizer steps to run."""
    time_limit: float = 0.0
    """Seconds of training at most (0: no limit). The run ends after the first step that reaches
    it, or at max_steps if that comes first, and the learning rate decays by whichever of steps
    and seconds is further along, so it reaches min_lr as the time runs out. A resumed run counts
    its earlier seconds. The steps done then follow the machine's speed: a time limit gives up
    step-for-step repeatability for a bounded wait."""
    lr: float = 3e-4
    """Peak learning rate (the seed's default is 3e-4)."""
    min_lr: float = 3e-5
    """Learning rate at the end of the decay."""
    warmup_steps: int = 100
    """Steps of linear warmup from 0 to lr."""
    lr_schedule: str = "cosine"
    """After warmup: `cosine` or `linear` decay to min_lr, or `constant`."""
    decay_steps: int | None = None
    """Step at which the decay reaches min_lr (None: max_steps)."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay, applied to matrices only (Linear weights and embedding
    tables); biases and norm gains are not decayed."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.99
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables clipping)."""
    optimizer: str = "adamw"
    """`adamw`, or `muon`: torch.optim.Muon (orthogonalised momentum) on the 2-D matrices inside the
    Transformer blocks and AdamW on the rest (embeddings, lm_head, norms, biases); both follow lr
    and its schedule (Muon's step is rescaled to AdamW's size). Not with fsdp."""
    muon_momentum: float = 0.95
    """Muon's (Nesterov) momentum, in [0, 1); only used with optimizer muon."""

    # --- speed and precision ---
    dtype: str = "float32"
    """Compute precision: `float32`, `bfloat16` (autocast, CPU or CUDA), `float16` (CUDA, with
    gradient scaling), or `auto`: bfloat16 where the device multiplies it natively (a CUDA GPU
    that supports it, a CPU with AVX512-BF16, AMX or the aarch64 BF16 extension), else float32
    (scratchlm.machine.cpu.auto_dtype; `scratchlm doctor` says which)."""
    compile: bool = False
    """Compile the model with torch.compile (slow start, faster steps)."""
    fused_loss: bool = True
    """Compute the output layer and the loss together in chunks of rows (scratchlm.model.fused_loss):
    the same loss and gradients without ever holding all batch x vocabulary scores; faster and
    far leaner at large vocabularies. Used where a micro-batch has at least a million scores
    (batch x context x vocabulary; below that, e.g. English characters at the baby shape, the
    plain path is faster and is taken). False always uses the plain lm_head + F.cross_entropy."""
    activation_checkpointing: bool = False
    """Recompute each block's activations during backward instead of storing them (less memory)."""
    device: str = "auto"
    """`auto` (cuda, then mps, then cpu), or a torch device such as `cpu`, `cuda`, `cuda:1`."""
    threads: int | None = None
    """CPU threads for torch (None: torch's default)."""
    seed: int = 1337
    """Seed for initialisation, batches, dropout and samples."""
    fsdp: bool = False
    """Under torchrun: shard parameters, gradients and optimizer state with FSDP2 instead of DDP."""

    # --- evaluation, logging, saving ---
    eval_interval: int = 250
    """Evaluate every this many steps (and at the end); 0 evaluates only at the end."""
    eval_iters: int = 50
    """Validation batches per evaluation: the estimate's noise shrinks as 1/sqrt(eval_iters), its
    cost grows with it."""
    full_eval_windows: int = 4096
    """The last evaluation reads the whole validation split when it holds at most this many
    windows of block_size tokens (else it draws eval_iters batches like the others)."""
    log_interval: int = 50
    """Log the training loss at step 1 and every this many steps."""
    sample_interval: int = 0
    """Print a short sample every this many steps (0: with every evaluation)."""
    sample_tokens: int = 120
    """Tokens per printed sample (0 disables samples)."""
    checkpoint_interval: int = 1000
    """Save a checkpoint every this many steps (and at the end)."""
    keep_last: int = 0
    """Keep only the newest K checkpoints (0 keeps all)."""
    max_bad_steps: int = 5
    """Stop after this many non-finite-loss steps in a row (each such step is skipped)."""
    out_dir: str | None = None
    """Run directory (None: runs/<preset>-<time>). An existing run is never overwritten."""
    resume: str | None = None
    """Continue the run in this directory from its latest checkpoint."""
    init_from: str | None = None
    """Start from this trained model (a scratchlm run or checkpoint, or a local Hugging Face folder):
    its architecture, weights and tokenizer, with a fresh optimizer and schedule on `data`. Only
    `dropout` of the model fields may change."""
    stage: str = "pretrain"
    """What the loop learns: `pretrain` (the next token of text, from token shards) or `sft`
    (supervised fine-tuning: the replies of the conversations in `data`, a .jsonl or .parquet file,
    through the chat template, starting from `init_from`; `scratchlm sft` sets it)."""
    train_on: str = "assistant"
    """The sft stage's loss: on the replies only (`assistant`), or on every turn's text (`all`)."""
    lora_rank: int = 0
    """LoRA's rank r (scratchlm.model.lora) for a run that starts `--init_from` a model: only the
    adapters (and the rows of ids the tokenizer gained) train, and checkpoints hold only them, beside
    the run's one copy of the base (RUN/base); 0 trains every weight."""
    lora_alpha: float = 16.0
    """LoRA's alpha: the change to each matrix is (alpha / r) B A."""
    lora_targets: str = "all"
    """The block matrices LoRA adapts, comma-separated: attn.c_attn, attn.c_proj, mlp.c_fc,
    mlp.c_proj, or `all` (every one)."""
    progress: str = "auto"
    """`auto` (a progress bar on a terminal, log lines otherwise), `bar`, `lines` or `quiet`."""
    preset: str | None = None
    """The training preset this config came from (informational)."""

    def __post_init__(self) -> None:
        self.validate()

    def _check_lora(self) -> None:
        from scratchlm.model.lora import parse_targets

        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ConfigError("lora_rank", f"must be a whole number >= 0 (0: no LoRA), got {self.lora_rank!r}")
        try:
            parse_targets(self.lora_targets)
        except ValueError as exc:
            raise ConfigError("lora_targets", f"{exc}; the targets are attn.c_attn, attn.c_proj, mlp.c_fc, "
                                              "mlp.c_proj or all") from None
        if not self.lora_rank:
            return
        if not self.lora_alpha > 0:
            raise ConfigError("lora_alpha", f"must be above 0, got {self.lora_alpha!r}")
        if not (self.init_from or self.resume):
            raise ConfigError("lora_rank", "LoRA adapts a trained model: give --init_from RUN_OR_HF_DIR")
        if self.fsdp or self.optimizer != "adamw":
            raise ConfigError("lora_rank", "LoRA trains with --optimizer adamw and without --fsdp")

    def validate(self) -> None:
        self._check_types()
        if self.errors not in ("strict", "replace"):
            raise ConfigError("errors", f"{self.errors!r} is not one of strict, replace")
        for name in ("batch_size", "grad_accum", "max_steps", "eval_iters", "pad_vocab_multiple", "max_bad_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(name, f"must be a positive whole number, got {value!r}")
        for name in ("warmup_steps", "eval_interval", "full_eval_windows", "log_interval", "sample_interval", "sample_tokens",
                     "checkpoint_interval", "keep_last"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(name, f"must be a whole number >= 0, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ConfigError("seed", f"must be a whole number from 0 to 2**32 - 1 (NumPy's range), got {self.seed!r}")
        if self.threads is not None and self.threads <= 0:  # a whole number or None: _check_types
            raise ConfigError("threads", f"must be a positive whole number (or none for torch's default), got {self.threads!r}")
        if self.windows not in WINDOWS:
            raise ConfigError("windows", f"unknown {self.windows!r}; choose one of {', '.join(WINDOWS)}")
        if self.stage not in STAGES:
            raise ConfigError("stage", f"unknown {self.stage!r}; choose one of {', '.join(STAGES)}")
        if self.train_on not in TRAIN_ON:
            raise ConfigError("train_on", f"unknown {self.train_on!r}; choose one of {', '.join(TRAIN_ON)}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError("lr_schedule", f"unknown {self.lr_schedule!r}; choose one of {', '.join(LR_SCHEDULES)}")
        if self.dtype not in DTYPES:
            raise ConfigError("dtype", f"unknown {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError("optimizer", f"unknown {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if not 0 <= self.muon_momentum < 1:
            raise ConfigError("muon_momentum", f"must be in [0, 1), got {self.muon_momentum!r}")
        self._check_lora()
        if self.optimizer == "muon" and self.fsdp:
            raise ConfigError("optimizer", "Muon orthogonalises whole matrices; FSDP shards them: "
                                           "use --optimizer adamw with --fsdp")
        if not self.lr > 0 or self.min_lr < 0:
            raise ConfigError("lr", "lr must be positive and min_lr >= 0")
        for name in ("grad_clip", "weight_decay", "time_limit"):
            if not getattr(self, name) >= 0:  # NaN too; 0 switches it off
                raise ConfigError(name, f"must be >= 0 (0 switches it off), got {getattr(self, name)!r}")
        if not 0 < self.val_fraction < 1:
            raise ConfigError("val_fraction", f"must be between 0 and 1, got {self.val_fraction}")
        if self.progress not in ("auto", "bar", "lines", "quiet"):
            raise ConfigError("progress", "choose one of auto, bar, lines, quiet")
        if "vocab_size" in self.model_overrides:
            raise ConfigError("vocab_size", "the model's vocab_size comes from the tokenizer; set pad_vocab_multiple instead")

    def _check_types(self) -> None:
        """Each field holds its annotated type (a config read from JSON can hold anything), so the
        range checks below compare numbers with numbers."""
        for f in fields(self):
            value, annotation = getattr(self, f.name), str(f.type)
            if value is None and "None" in annotation:
                continue
            kind = next(k for k in ("dict", "bool", "int", "float", "str") if k in annotation)  # dict[str, ...] first
            ok = {
                "bool": isinstance(value, bool),
                "int": isinstance(value, int) and not isinstance(value, bool),
                "float": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                "str": isinstance(value, str),
                "dict": isinstance(value, dict),
            }[kind]
            if not ok:
                what = {"bool": "true or false", "int": "a whole number", "float": "a finite number", "str": "a string",
                        "dict": "a mapping"}[kind]
                raise ConfigError(f.name, f"must be {what}{' or none' if 'None' in annotation else ''}, got {value!r}")

    def model_config(self, vocab_size: int) -> GPTConfig:
        return GPTConfig.from_name(self.model, **{**self.model_overrides, "vocab_size": vocab_size})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], complete: bool = False) -> "TrainConfig":
        """The config of `values`; complete=True (a run's saved config) refuses a missing field too."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(unknown[0], "not a training config field")
        # fields added after runs were saved take their defaults when such a run resumes
        missing = [f.name for f in fields(cls) if f.name not in values and f.name not in _ADDED_LATER]
        if complete and missing:
            raise ConfigError(missing[0], "missing from the run's saved training config")
        return cls(**values)


_ADDED_LATER = frozenset({"errors", "windows", "time_limit", "stage", "train_on", "lora_rank", "lora_alpha",
                          "lora_targets"})

# The classic CPU "baby GPT": 4 layers, 4 heads, width 128, context 64, batch 12, on characters.
# RoPE instead of a learned position table, and a higher learning rate than nanoGPT's 1e-3: on
# Tiny Shakespeare this reaches validation loss 1.88 in about half the steps (docs/performance.md). lm_head
# keeps the seed's bias: the Muon preset reaches the loss about 90 steps sooner with it, and
# `export-hf` folds it into ln_f's bias (exact while the vocabulary is no wider than n_embd).
_BABY = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, activation="gelu", init="gpt2",
             pos_embedding="rope")

TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    "shakespeare-char": dict(
        model="smoke", model_overrides=_BABY, tokenizer="char", data="shakespeare",
        batch_size=12, max_steps=1100, lr=3e-3, min_lr=1e-4, warmup_steps=50, beta2=0.99,
        eval_interval=500, eval_iters=50, log_interval=50, checkpoint_interval=500,
    ),
    # The same baby GPT trained for wall time: Muon on the blocks' matrices (--optimizer muon) takes
    # a 3x higher learning rate and needs under half the steps; each step costs more (the
    # Newton-Schulz iterations). benchmarks/bench_time_to_loss.py measures both, beside the AdamW
    # preset, in one sitting.
    "shakespeare-char-fast": dict(
        model="smoke", model_overrides=_BABY, tokenizer="char", data="shakespeare",
        batch_size=12, max_steps=500, lr=1e-2, min_lr=1e-4, warmup_steps=20, beta2=0.99, optimizer="muon",
        eval_interval=250, eval_iters=50, log_interval=50, checkpoint_interval=500,
    ),
    # Chinese verse from the built-in Tang poems (--data tang), on characters: the fast preset's
    # model and optimizer without the lm_head bias (9,000-odd characters are far wider than the
    # model, and export-hf folds a bias only into a vocabulary no wider than n_embd), in bfloat16
    # where the CPU multiplies it natively, with windows that start at a line so a prompt is
    # read as a line's beginning. It trains for a time, not a number of steps: 160 s on any CPU, a
    # slower one taking fewer steps in it; the last evaluation (25 batches), sample and checkpoint
    # come after, within three minutes even on a machine busy with other work.
    # benchmarks/bench_tang.py measures its time, steps and verse, with bfloat16 and without.
    "tang-poems": dict(
        model="smoke", model_overrides={**_BABY, "lm_head_bias": False}, tokenizer="char", data="tang",
        batch_size=12, max_steps=20000, time_limit=160.0, lr=1e-2, min_lr=1e-4, warmup_steps=20, beta2=0.99,
        optimizer="muon", dtype="auto", windows="lines", eval_interval=0, eval_iters=25, log_interval=100,
        checkpoint_interval=1000,
    ),
    # The seed's smoke model on BPE tokens trained from the data (8192 by default; works offline),
    # a few hundred steps, without the lm_head bias so that it exports as a GPT-2 (`export-hf`).
    # With --tokenizer gpt2 (and --tokenizer_file gpt2.tiktoken when offline) and --lm_head_bias
    # the vocabulary pads to 50304 and the model is the seed's exact 13,356,928 parameters.
    "smoke": dict(
        model="smoke", model_overrides=dict(lm_head_bias=False), tokenizer="bpe", pad_vocab_multiple=64,
        batch_size=4, max_steps=200,
        lr=3e-4, min_lr=3e-5, warmup_steps=20, eval_interval=100, eval_iters=20, log_interval=10,
        checkpoint_interval=100,
    ),
    # Supervised fine-tuning (`scratchlm sft`): the model, its size and its tokenizer are the
    # --init_from source's; a tenth of pre-training's learning rate, short warmup, a few hundred
    # steps on the replies of --data's conversations, and the held-out conversations' loss every 100.
    "sft": dict(
        model="smoke", tokenizer="char", data="conversations.jsonl", stage="sft", batch_size=8, max_steps=300,
        lr=3e-4, min_lr=3e-5, warmup_steps=20, eval_interval=100, eval_iters=1, log_interval=10,
        checkpoint_interval=100, sample_tokens=0,
    ),
    # The tang-poems run taught to answer requests for poems (--data tang-sft, scratchlm.data.tang_sft):
    # `scratchlm sft --preset tang-chat --init_from TANG_RUN`. Its context grows to 128 (RoPE), so a
    # request and a whole 七言律诗 fit in one row.
    "tang-chat": dict(
        model="smoke", model_overrides={"block_size": 128}, tokenizer="char", data="tang-sft", stage="sft",
        batch_size=16, max_steps=20000, time_limit=180.0, lr=2e-3, min_lr=1e-4, warmup_steps=20, beta2=0.99,
        dtype="auto", eval_interval=0, eval_iters=1, log_interval=50, checkpoint_interval=1000, sample_tokens=0,
    ),
    # GPT-2 small, nanoGPT-style: about 0.5M tokens per step with grad_accum 40 on one GPU.
    "gpt2-124m": dict(
        model="gpt2-124m", tokenizer="gpt2", pad_vocab_multiple=64, batch_size=12, grad_accum=40,
        max_steps=600000, lr=6e-4, min_lr=6e-5, warmup_steps=2000, beta2=0.95, weight_decay=0.1,
        dtype="auto", compile=True, eval_interval=1000, eval_iters=200, log_interval=10,
        checkpoint_interval=1000, keep_last=3,
    ),
    # The seed's default size (about 400M parameters): activation checkpointing to fit memory; no
    # lm_head bias, so that it exports as a GPT-2.
    "seed-400m": dict(
        model="seed-400m", model_overrides=dict(lm_head_bias=False), tokenizer="gpt2", pad_vocab_multiple=64,
        batch_size=8, grad_accum=16,
        max_steps=100000, lr=3e-4, min_lr=3e-5, warmup_steps=2000, beta2=0.95, dtype="auto",
        compile=True, activation_checkpointing=True, eval_interval=1000, eval_iters=100,
        log_interval=10, checkpoint_interval=1000, keep_last=3,
    ),
}


def config_from_preset(name: str, **overrides: Any) -> TrainConfig:
    """The training preset `name` with fields changed; model field overrides merge, not replace.
    With `init_from` the model and tokenizer are the source's: tokenizer fields and model fields
    other than SOURCE_MAY_CHANGE given with it are refused, and of the preset's model fields only
    its context (block_size) applies."""
    if name not in TRAIN_PRESETS:
        raise ConfigError("preset", f"unknown training preset {name!r}; choose one of {', '.join(TRAIN_PRESETS)}")
    tokenizer_flags = sorted({"tokenizer", "vocab_size", "tokenizer_file"} & set(overrides))
    if overrides.get("init_from") and tokenizer_flags:  # as cli refuses the model flags: the source decides
        flags = ", ".join("--" + f for f in tokenizer_flags)
        raise UserError(f"--init_from keeps the tokenizer of the model it starts from (the weights learned its ids); "
                        f"drop {flags}")
    values = {**TRAIN_PRESETS[name], "preset": name}
    given, preset_model = overrides.pop("model_overrides", {}), values.get("model_overrides", {})
    if overrides.get("init_from"):  # the source's model: the flags' --dropout and --block_size, the preset's context
        changed = sorted(set(given) - set(SOURCE_MAY_CHANGE))
        if changed:
            raise UserError(f"--init_from keeps the model it starts from; drop {', '.join('--' + f for f in changed)} "
                            "(only --dropout and --block_size may change)")
        preset_model = {k: v for k, v in preset_model.items() if k == "block_size"}
    return TrainConfig.from_dict({**values, **overrides, "model_overrides": {**preset_model, **given}})


# --------------------------------------------------------------------------------------------
# Fields for the command line
# --------------------------------------------------------------------------------------------


@dataclass
class CliField:
    name: str
    kind: str
    """`int`, `float`, `str` or `bool`."""
    optional: bool
    """None is an accepted value (written `none` on the command line)."""
    default: Any
    doc: str
    model: bool
    """A GPTConfig field (goes into model_overrides) rather than a TrainConfig one."""


def cli_fields() -> list[CliField]:
    """Every setting `scratchlm train` exposes, training and model fields in one flat namespace.

    GPTConfig's vocab_size is left out (the tokenizer decides it); `vocab_size` on the command line
    is the size of a BPE tokenizer to train.
    """
    rows = []
    skip_train = {"model_overrides", "resume", "preset"}
    for cls, is_model in ((TrainConfig, False), (GPTConfig, True)):
        for f in setting_fields(cls):
            if (f.name in skip_train and not is_model) or (is_model and f.name == "vocab_size"):
                continue
            if f.kind in ("dict", "other"):
                continue
            rows.append(CliField(f.name, f.kind, f.optional, f.default, f.doc, is_model))
    return rows
