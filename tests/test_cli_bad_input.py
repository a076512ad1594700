"""Bad input across the whole command line, driven as real `python -m scratchlm` processes.

Every case builds its files in a folder of its own (the process runs there too, so a stray
`runs/` or temp file would show), hashes the folder, runs one malformed command, and checks:
exit status 2, exactly one stderr line of the form `error: ...` holding the words that say what
is wrong, and every file and folder byte-identical afterwards (nothing changed, nothing added).
The cases run two at a time, each in a process forked from one that has imported torch
(tests/cli_forks.py; the runner is helpers.run_all), so they do not spend ~2 s each importing
it. The few that need a trained model share one tiny run, trained once per session.

Data-preparation cases that test_data_bad_input.py already covers (empty text, invalid UTF-8, a
parquet file without its column, ...) are not repeated here.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch

from helpers import Case, Outcome, case_problems, hf_dir, run_all, train_tiny_run


# ------------------------------------------------------------------------------ building blocks


def _files(**content: bytes | str) -> Callable[[Path, Path], None]:
    """A setup that writes files (keys use __ for / and _dot_ for .)."""
    def setup(d: Path, run: Path) -> None:
        for key, value in content.items():
            path = d / key.replace("__", "/").replace("_dot_", ".")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(value.encode() if isinstance(value, str) else value)
    return setup


def _copy_run(d: Path, run: Path) -> Path:
    shutil.copytree(run, d / "run")
    return d / "run"


def _with_run(change: Callable[[Path], None] | None = None) -> Callable[[Path, Path], None]:
    """A setup that copies the session's tiny run to d/run, then changes its latest checkpoint."""
    def setup(d: Path, run: Path) -> None:
        copy = _copy_run(d, run)
        if change is not None:
            change(copy / "ckpt-00000004")
    return setup


def _edit_config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(ckpt: Path) -> None:
        cfg = json.loads((ckpt / "config.json").read_text())
        edit(cfg)
        (ckpt / "config.json").write_text(json.dumps(cfg))
    return change


def _truncate(name: str) -> Callable[[Path], None]:
    def change(ckpt: Path) -> None:
        data = (ckpt / name).read_bytes()
        (ckpt / name).write_bytes(data[: len(data) // 2])
    return change


def _wrong_shape(ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(ckpt / "model.safetensors"))
    weights["lm_head.weight"] = torch.zeros(8, 16)  # vocab_size 40 in config.json
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt"})


def _bigger_tokenizer(ckpt: Path) -> None:
    # the run's characters and 300 more beside a 40-entry model: ids the model has no row for
    path = ckpt.parent / "tokenizer" / "tokenizer_config.json"
    chars = json.loads(path.read_text())["chars"] + "".join(chr(c) for c in range(0x100, 0x100 + 300))
    path.write_text(json.dumps({"kind": "char", "chars": chars}))


def _run_data(edit: Callable[[str], str]) -> Callable[[Path, Path], None]:
    """A setup that writes d/g.txt: the text the tiny run was trained on, edited."""
    def setup(d: Path, run: Path) -> None:
        (d / "g.txt").write_text(edit((run.parent / "text.txt").read_text(encoding="utf-8")), encoding="utf-8")
    return setup


def _fifo(d: Path, run: Path) -> None:
    os.mkfifo(d / "fifo")


def _drop_field(section: str, name: str) -> Callable[[Path], None]:
    return _edit_config(lambda c: c[section].pop(name))


def _pickle_protocol_4(d: Path, run: Path) -> None:
    import pickle

    hf_dir({}, weights="none")(d, run)
    with open(d / "hf" / "pytorch_model.bin", "wb") as f:
        pickle.dump({"transformer.wte.weight": torch.zeros(50, 16)}, f, protocol=4)


def _setups(*steps: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    def setup(d: Path, run: Path) -> None:
        for step in steps:
            step(d, run)
    return setup


# ------------------------------------------------------------------------------ the cases (helpers.Case)


GEN = ["generate", "--checkpoint", "{d}/run", "--prompt", "the king", "--max-new-tokens", "3", "--device", "cpu"]
GEN_CKPT = [*GEN[:2], "{d}/run/ckpt-00000004", *GEN[3:]]  # the checkpoint itself, not the run (no fallback)
TRAIN = ["train", "--preset", "shakespeare-char", "--data", "{d}/t.txt", "--tokenizer", "char", "--max_steps", "2",
         "--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--block_size", "8", "--batch_size", "2", "--threads", "1",
         "--progress", "quiet", "--out_dir", "{d}/new-run"]
TEXT = _files(t_dot_txt="the king speaks to the queen of the night\n" * 40)
CHAR_TOK = '{"kind": "char", "chars": "abc"}'

CASES = [
    # --- prepare
    Case("prepare: binary file", ["prepare", "--data", "{d}/img.txt", "--tokenizer", "char", "--out", "{d}/out"],
         ["img.txt", "invalid UTF-8 at byte offset 0"], _files(img_dot_txt=b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe" * 8)),
    Case("prepare: output under a regular file", ["prepare", "--data", "{d}/t.txt", "--tokenizer", "char", "--out", "{d}/t.txt/out"],
         ["t.txt", "not a folder"], TEXT),
    Case("prepare: output is a regular file", ["prepare", "--data", "{d}/t.txt", "--tokenizer", "char", "--out", "{d}/t.txt"],
         ["t.txt", "not a folder"], TEXT),
    Case("prepare: output in a folder nobody can write", ["prepare", "--data", "{d}/t.txt", "--tokenizer", "char",
                                                          "--out", "/proc/scratchlm-out"], ["/proc", "cannot write"], TEXT),
    Case("prepare: --val-fraction 1.5", ["prepare", "--data", "{d}/t.txt", "--val-fraction", "1.5", "--out", "{d}/out"],
         ["val_fraction", "1.5"], TEXT),
    Case("prepare: --vocab-size 0", ["prepare", "--data", "{d}/t.txt", "--vocab-size", "0", "--out", "{d}/out"],
         ["vocab_size", "positive"], TEXT),
    Case("prepare: --block-size -1", ["prepare", "--data", "{d}/t.txt", "--block-size", "-1", "--out", "{d}/out"],
         ["block_size", "positive"], TEXT),
    Case("prepare: unknown tokenizer", ["prepare", "--data", "{d}/t.txt", "--tokenizer", "words", "--out", "{d}/out"],
         ["--tokenizer", "invalid choice", "words"], TEXT),
    Case("prepare: tokenizer folder of the wrong kind",
         ["prepare", "--data", "{d}/t.txt", "--tokenizer", "bpe", "--tokenizer-file", "{d}/tok", "--out", "{d}/out"],
         ["tok", "char tokenizer, not bpe"], _setups(TEXT, _files(tok__tokenizer_config_dot_json=CHAR_TOK))),
    Case("prepare: tokenizer.json that is not one",
         ["prepare", "--data", "{d}/t.txt", "--tokenizer", "bpe", "--tokenizer-file", "{d}/tok.json", "--out", "{d}/out"],
         ["tok.json", "not a Hugging Face tokenizer.json"], _setups(TEXT, _files(tok_dot_json="{oops"))),
    Case("prepare: gpt2 rank file that is not one",
         ["prepare", "--data", "{d}/t.txt", "--tokenizer", "gpt2", "--tokenizer-file", "{d}/gpt2.tiktoken", "--out", "{d}/out"],
         ["gpt2.tiktoken", "rank file"], _setups(TEXT, _files(gpt2_dot_tiktoken="not base64 at all\n"))),
    Case("prepare: tokenizer config with a number for chars",
         ["prepare", "--data", "{d}/t.txt", "--tokenizer", "char", "--tokenizer-file", "{d}/tok", "--out", "{d}/out"],
         ["tokenizer_config.json"], _setups(TEXT, _files(tok__tokenizer_config_dot_json='{"kind": "char", "chars": 5}'))),
    Case("prepare: jsonl line that is a list", ["prepare", "--data", "{d}/d.jsonl", "--out", "{d}/out"],
         ["d.jsonl line 2", "JSON object"], _files(d_dot_jsonl='{"text": "fine"}\n[1, 2]\n')),
    Case("prepare: parquet file that is text", ["prepare", "--data", "{d}/d.parquet", "--out", "{d}/out"],
         ["d.parquet", "not a readable parquet file"], _files(d_dot_parquet="just words\n")),
    Case("prepare: --val-fraction not a number", ["prepare", "--data", "{d}/t.txt", "--val-fraction", "ten", "--out", "{d}/out"],
         ["--val-fraction", "ten"], TEXT),
    # --- output folders (issue 30): only into a new or empty folder, or the same command's own
    Case("prepare: into a folder holding the user's meta.json, train-00000.bin and train.bin",
         ["prepare", "--data", "{d}/t.txt", "--tokenizer", "char", "--out", "{d}/mine"],
         ["mine", "did not write", "meta.json, train-00000.bin, train.bin"],
         _setups(TEXT, _files(**{"mine/meta.json": '{"mine": 1}', "mine/train.bin": "my own bytes",
                                 "mine/train-00000.bin": "my own shard"}))),
    Case("prepare: into a training run's folder", ["prepare", "--data", "{d}/t.txt", "--tokenizer", "char", "--out", "{d}/run"],
         ["run", "training run's folder", "ckpt-00000002"], _setups(_with_run(), TEXT)),
    Case("prepare: into the folder of its input", ["prepare", "--data", "{d}/in/t.txt", "--tokenizer", "char", "--out", "{d}/in"],
         ["--out", "own input", "t.txt"], _files(in__t_dot_txt="the king speaks to the queen of the night\n" * 40)),
    Case("prepare: into its own --tokenizer-file folder",
         ["prepare", "--data", "{d}/t.txt", "--tokenizer", "char", "--tokenizer-file", "{d}/tok", "--out", "{d}/tok"],
         ["--out", "own input", "tok"], _setups(TEXT, _files(tok__tokenizer_config_dot_json=CHAR_TOK))),
    Case("prepare: into a folder another scratchlm command marked",
         ["prepare", "--data", "{d}/t.txt", "--tokenizer", "char", "--out", "{d}/other"], ["other", "did not write"],
         _setups(TEXT, _files(**{"other/.scratchlm-output": "scratchlm export-hf\n", "other/meta.json": "{}"}))),
    Case("train: --out_dir a folder prepare wrote",
         [*TRAIN[:-1], "{d}/prep"], ["prep", "already holds files"],
         _setups(TEXT, _files(**{"prep/.scratchlm-output": "scratchlm prepare\n", "prep/meta.json": "{}"}))),
    Case("train: --out_dir the folder of its data", [*TRAIN[:4], "{d}/in/t.txt", *TRAIN[5:-1], "{d}/in"],
         ["in", "already holds files"], _files(in__t_dot_txt="the king speaks to the queen of the night\n" * 40)),
    Case("export-hf: into the run it reads", ["export-hf", "{d}/run", "{d}/run"], ["run", "not empty"], _with_run()),
    Case("import-hf: into the folder it reads", ["import-hf", "{d}/hf", "{d}/hf"], ["hf", "not empty"], hf_dir({})),
    Case("plot: --out onto its own log with --force", ["plot", "{d}/run", "--out", "{d}/run/metrics.jsonl", "--force"],
         ["--out", "own input", "metrics.jsonl"], _with_run()),
    Case("attention: --out onto the weights it reads, with --force",
         ["attention", "--checkpoint", "{d}/run", "--prompt", "the king", "--out", "{d}/run/ckpt-00000004/model.safetensors",
          "--force"], ["--out", "own input", "ckpt-00000004"], _with_run()),
    Case("attention: --out onto the run's latest, with --force",
         ["attention", "--checkpoint", "{d}/run", "--prompt", "the king", "--out", "{d}/run/latest", "--force"],
         ["--out", "own input", "latest"], _with_run()),
    # --- resume: nothing to train (issue 30)
    Case("resume: --max_steps below the run's step", ["train", "--resume", "{d}/run", "--max_steps", "3"],
         ["step 4", "--max_steps is 3", "nothing to train", "above 4"], _with_run()),
    Case("resume: a finished run as it was", ["train", "--resume", "{d}/run"], ["step 4", "--max_steps is 4", "nothing to train"],
         _with_run()),
    Case("resume: a run killed while it started", ["train", "--resume", "{d}/r"], ["r", "killed while it started", "--out_dir"],
         _files(**{"r/.lock": "999999\n", "r/tokenizer/tokenizer_config.json": CHAR_TOK})),
    # --- train
    Case("train: --n_embd 0", [*TRAIN, "--n_embd", "0"], ["n_embd", "positive"], TEXT),
    Case("train: --n_head 3 with --n_embd 128", [*TRAIN, "--n_head", "3", "--n_embd", "128"], ["n_embd", "128", "3"], TEXT),
    Case("train: --lr -1", [*TRAIN, "--lr", "-1"], ["lr", "positive"], TEXT),
    Case("train: --seed -1", [*TRAIN, "--seed", "-1"], ["seed", "-1", "2**32 - 1"], TEXT),
    Case("train: --seed 2**32", [*TRAIN, "--seed", str(2**32)], ["seed", str(2**32)], TEXT),
    Case("train: --batch_size 2.5", [*TRAIN, "--batch_size", "2.5"], ["--batch_size", "2.5"], TEXT),
    Case("train: unknown preset", [*TRAIN, "--preset", "gpt5"], ["--preset", "gpt5"], TEXT),
    Case("train: unknown tokenizer", [*TRAIN, "--tokenizer", "words"], ["tokenizer", "words"], TEXT),
    Case("train: missing data", [*TRAIN, "--data", "{d}/nowhere.txt"], ["nowhere.txt", "no such file"]),
    Case("train: corpus shorter than one window", [*TRAIN, "--block_size", "4096"], ["window", "4097"], TEXT),
    Case("train: run directory that already holds a run", [*TRAIN, "--out_dir", "{d}/run"], ["run", "--resume"],
         _setups(TEXT, _with_run())),
    Case("train: run directory under a regular file", [*TRAIN, "--out_dir", "{d}/t.txt/run"], ["t.txt", "not a folder"], TEXT),
    Case("train: run directory in a folder nobody can write", [*TRAIN, "--out_dir", "/proc/scratchlm-run"],
         ["/proc/scratchlm-run"], TEXT),
    Case("train: --dtype float16 on CPU", [*TRAIN, "--dtype", "float16", "--device", "cpu"], ["float16", "CUDA"], TEXT),
    Case("train: unknown device", [*TRAIN, "--device", "banana"], ["--device", "banana"], TEXT),
    Case("train: --threads -1", [*TRAIN, "--threads", "-1"], ["threads", "-1"], TEXT),
    Case("train: --dropout 1.5", [*TRAIN, "--dropout", "1.5"], ["dropout", "1.5"], TEXT),
    Case("train: unknown activation", [*TRAIN, "--activation", "swish"], ["activation", "swish"], TEXT),
    Case("train: --max_steps 0", [*TRAIN, "--max_steps", "0"], ["max_steps", "0"], TEXT),
    Case("train: --val_fraction 0", [*TRAIN, "--val_fraction", "0"], ["val_fraction", "0"], TEXT),
    Case("train: unknown optimizer", [*TRAIN, "--optimizer", "lion"], ["optimizer", "lion", "adamw, muon"], TEXT),
    Case("train: --optimizer muon with --fsdp", [*TRAIN, "--optimizer", "muon", "--fsdp"], ["FSDP", "--optimizer adamw"], TEXT),
    # --- train --resume
    Case("resume: no such run", ["train", "--resume", "{d}/nowhere"], ["nowhere", "no checkpoint"]),
    Case("resume: latest names a missing checkpoint", ["train", "--resume", "{d}/r"], ["no checkpoint"],
         _files(r__latest="ckpt-00000099\n")),
    Case("resume: truncated trainer state", ["train", "--resume", "{d}/run"], ["trainer_state.pt", "cannot read"],
         _with_run(_truncate("trainer_state.pt"))),
    Case("resume: missing optimizer state", ["train", "--resume", "{d}/run"], ["optimizer.pt", "missing"],
         _with_run(lambda c: (c / "optimizer.pt").unlink())),
    Case("resume: config.json is not JSON", ["train", "--resume", "{d}/run"], ["config.json", "not valid JSON"],
         _with_run(lambda c: (c / "config.json").write_text("{\"model\": "))),
    Case("resume: with model flags", ["train", "--resume", "{d}/run", "--n_layer", "3"], ["--resume", "model flags"], _with_run()),
    Case("resume: into another --out_dir", ["train", "--resume", "{d}/run", "--out_dir", "{d}/other"], ["--out_dir"], _with_run()),
    Case("resume: with another optimizer", ["train", "--resume", "{d}/run", "--optimizer", "muon"],
         ["--optimizer adamw", "same optimizer"], _with_run()),
    Case("resume: data with more characters than the model", ["train", "--resume", "{d}/run", "--data", "{d}/wide.txt"],
         ["data changed", "wide.txt"], _setups(_with_run(), _files(wide_dot_txt="".join(chr(c) for c in range(0x400, 0x480)) * 10))),
    Case("resume: the data file changed in place (same size)",
         ["train", "--resume", "{d}/run", "--data", "{d}/g.txt", "--max_steps", "6"], ["data changed", "sha256", "g.txt"],
         _setups(_with_run(), _run_data(lambda t: t.replace("e", "o")))),
    Case("resume: text appended to the data", ["train", "--resume", "{d}/run", "--data", "{d}/g.txt", "--max_steps", "6"],
         ["data changed", "bytes"], _setups(_with_run(), _run_data(lambda t: t + "The king speaks.\n"))),
    Case("resume: training config without a field", ["train", "--resume", "{d}/run", "--max_steps", "6"],
         ["config.json", "lr", "missing"], _with_run(_drop_field("train", "lr"))),
    Case("resume: --data /dev/null", ["train", "--resume", "{d}/run", "--data", "/dev/null"],
         ["/dev/null", "not a regular file"], _with_run()),
    Case("train: --data is a FIFO", [*TRAIN, "--data", "{d}/fifo"], ["fifo", "not a regular file"], _fifo),
    Case("train: a model too big for this machine", [*TRAIN, "--n_embd", "1048576", "--n_layer", "64", "--n_head", "1"],
         ["parameters", "free", "n_embd"], TEXT),
    # --- generate
    Case("generate: checkpoint is a regular file", [*GEN[:2], "{d}/t.txt", *GEN[3:]], ["t.txt", "no checkpoint"], TEXT),
    Case("generate: weights file missing", GEN_CKPT, ["model.safetensors", "missing"],
         _with_run(lambda c: (c / "model.safetensors").unlink())),
    Case("generate: weights truncated", GEN, ["model.safetensors", "truncated"], _with_run(_truncate("model.safetensors"))),
    Case("generate: a tensor of the wrong shape", GEN, ["lm_head.weight", "(8, 16)", "(40, 16)"], _with_run(_wrong_shape)),
    Case("generate: config does not match the weights", GEN, ["config.json", "(40, 32)"],
         _with_run(_edit_config(lambda c: c["model"].update(n_embd=32)))),
    Case("generate: negative size in config.json", GEN, ["n_layer", "-1"],
         _with_run(_edit_config(lambda c: c["model"].update(n_layer=-1)))),
    Case("generate: non-integer size in config.json", GEN, ["n_embd", "16.5"],
         _with_run(_edit_config(lambda c: c["model"].update(n_embd=16.5)))),
    Case("generate: config.json without a model section", GEN, ["config.json", "'model'"],
         _with_run(_edit_config(lambda c: c.pop("model")))),
    Case("generate: tokenizer larger than the model", GEN, ["tokenizer", "340", "40"], _with_run(_bigger_tokenizer)),
    Case("generate: tokenizer of an unknown kind", GEN, ["tokenizer_config.json", "words"],
         _with_run(lambda c: (c.parent / "tokenizer" / "tokenizer_config.json").write_text('{"kind": "words"}'))),
    Case("generate: prompt with unknown characters", [*GEN[:3], "--prompt", "king \u00e9\u00e9\u4e2d", *GEN[5:]],
         ["'\u00e9'", "'\u4e2d'"], _with_run()),
    Case("generate: --max-new-tokens -5", [*GEN, "--max-new-tokens", "-5"], ["--max-new-tokens", "-5"], _with_run()),
    Case("generate: --max-new-tokens 10**9", [*GEN, "--max-new-tokens", str(10**9)], ["--max-new-tokens", str(10**9)], _with_run()),
    Case("generate: --top-p 1.5", [*GEN, "--top-p", "1.5"], ["top_p", "1.5"], _with_run()),
    Case("generate: --temperature -1", [*GEN, "--temperature", "-1"], ["temperature", "-1"], _with_run()),
    Case("generate: more samples than beams", [*GEN, "--beams", "2", "--num-samples", "3"], ["beams", "3"], _with_run()),
    Case("generate: --seed 2**64", [*GEN, "--seed", str(2**64)], ["seed", str(2**64), "2**63 - 1"], _with_run()),
    Case("generate: --seed -1", [*GEN, "--seed", "-1"], ["seed", "-1"], _with_run()),
    Case("generate: --length-penalty nan", [*GEN, "--beams", "2", "--length-penalty", "nan"], ["length_penalty", "nan"],
         _with_run()),
    Case("generate: --length-penalty inf without beams", [*GEN, "--length-penalty", "inf"], ["length_penalty", "inf"],
         _with_run()),
    Case("generate: prompt file is a folder", [*GEN[:3], "--prompt-file", "{d}/run", *GEN[5:]], ["--prompt-file", "run"], _with_run()),
    *([] if torch.cuda.is_available() else [  # on a machine with CUDA this is no error
        Case("generate: --device cuda without CUDA", [*GEN, "--device", "cuda"], ["cuda", "--device cpu"], _with_run())]),
    Case("generate: config.json without activation", GEN, ["config.json", "activation", "missing"],
         _with_run(_drop_field("model", "activation"))),
    Case("generate: config.json without n_head", GEN, ["config.json", "n_head", "missing"],
         _with_run(_drop_field("model", "n_head"))),
    Case("generate: vocab_size 10**12 in config.json", GEN, ["parameters", "free", "vocab_size"],
         _with_run(_edit_config(lambda c: c["model"].update(vocab_size=10**12)))),
    Case("generate: --device potato", [*GEN, "--device", "potato"], ["--device potato", "not a device"], _with_run()),
    Case("generate: --device mps where there is none", [*GEN, "--device", "mps"], ["--device mps", "not available"],
         _with_run()),
    Case("generate: --num-samples 10**8", [*GEN, "--num-samples", str(10**8)], ["100,000,000", "free", "--num-samples"],
         _with_run()),
    Case("generate: --prompt-file /dev/zero", [*GEN[:3], "--prompt-file", "/dev/zero", *GEN[5:]],
         ["--prompt-file", "/dev/zero", "longer than"], _with_run()),
    Case("generate: a Hugging Face folder", [*GEN[:2], "{d}/hf", *GEN[3:]], ["Hugging Face", "import-hf"], hf_dir({})),
    # --- plot, attention, walkthrough
    Case("plot: --out onto the training log", ["plot", "{d}/run", "--out", "{d}/run/metrics.jsonl"],
         ["metrics.jsonl", ".png", "--force"], _with_run()),
    Case("plot: --out a folder", ["plot", "{d}/run", "--out", "{d}/run"], ["--out", "is a folder"], _with_run()),
    Case("plot: a log that is not UTF-8", ["plot", "{d}/run"], ["metrics.jsonl", "not UTF-8"],
         _with_run(lambda c: (c.parent / "metrics.jsonl").write_bytes(b'{"event": "train"}\n\xff\xfe\x00bad\n'))),
    Case("attention: --dpi 100000", ["attention", "--checkpoint", "{d}/run", "--prompt", "the king", "--out", "{d}/a.png",
                                     "--dpi", "100000"], ["--dpi", "100000"], _with_run()),
    Case("attention: --out onto a text file", ["attention", "--checkpoint", "{d}/run", "--prompt", "the king", "--out",
                                               "{d}/t.txt"], ["t.txt", ".png"], _setups(_with_run(), TEXT)),
    Case("walkthrough: --preset smoke", ["walkthrough", "--preset", "smoke"], ["smoke", "lines", "--preset hand"]),
    Case("walkthrough: --preset gpt2-124m", ["walkthrough", "--preset", "gpt2-124m"], ["gpt2-124m", "lines"]),
    # --- inspect
    Case("inspect: unknown preset", ["inspect", "--preset", "gpt5"], ["preset", "gpt5"]),
    Case("inspect: --seq-len beyond the context", ["inspect", "--checkpoint", "{d}/run", "--seq-len", "1000"],
         ["--seq-len", "1000", "16"], _with_run()),
    Case("inspect: --batch-size 0", ["inspect", "--batch-size", "0"], ["--batch-size", "positive"]),
    Case("inspect: checkpoint folder with no checkpoint", ["inspect", "--checkpoint", "{d}/empty"], ["empty", "no checkpoint"],
         _files(empty__notes_dot_txt="not a checkpoint")),
    # --- export-hf
    Case("export-hf: into a non-empty folder", ["export-hf", "{d}/run", "{d}/out"], ["out", "not empty"],
         _setups(_with_run(), _files(out__keep_dot_txt="mine"))),
    Case("export-hf: output under a regular file", ["export-hf", "{d}/run", "{d}/t.txt/out"], ["t.txt", "not a folder"],
         _setups(_with_run(), TEXT)),
    Case("export-hf: post-norm blocks", ["export-hf", "{d}/run", "{d}/out"], ["norm_position", "--norm_position pre"],
         _with_run(_edit_config(lambda c: c["model"].update(norm_position="post")))),
    # --- import-hf
    Case("import-hf: a folder that is not GPT-2", ["import-hf", "{d}/hf", "{d}/out"], ["model_type", "bert"],
         hf_dir({"model_type": "bert"})),
    Case("import-hf: config.json that is not JSON", ["import-hf", "{d}/hf", "{d}/out"], ["config.json", "not valid JSON"],
         hf_dir("{not json")),
    Case("import-hf: no weights", ["import-hf", "{d}/hf", "{d}/out"], ["model.safetensors"], hf_dir({}, weights="none")),
    Case("import-hf: a weight of the wrong shape", ["import-hf", "{d}/hf", "{d}/out"], ["c_fc", "(16, 32)"],
         hf_dir({}, shape_bug=True)),
    Case("import-hf: n_embd not divisible by n_head", ["import-hf", "{d}/hf", "{d}/out"], ["n_embd", "n_head"],
         hf_dir({"n_head": 3})),
    Case("import-hf: a regular file", ["import-hf", "{d}/t.txt", "{d}/out"], ["t.txt", "not a directory"], TEXT),
    Case("import-hf: a pickle of protocol 4", ["import-hf", "{d}/hf", "{d}/out"], ["hf", "refused", "weights-only"],
         _pickle_protocol_4),
    Case("import-hf: into a non-empty folder", ["import-hf", "{d}/hf", "{d}/out"], ["out", "not empty"],
         _setups(hf_dir({}), _files(out__keep_dot_txt="mine"))),
    # --- the same errors under --debug: a traceback that ends in the UserError
    Case("debug: generate, weights file missing", GEN_CKPT, ["model.safetensors", "missing"],
         _with_run(lambda c: (c / "model.safetensors").unlink()), debug=True),
    Case("debug: train, --n_embd 0", [*TRAIN, "--n_embd", "0"], ["n_embd", "positive"], TEXT, debug=True),
]


# ------------------------------------------------------------------------------ running them


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("bad-input-run")
    return train_tiny_run(base, base / "run")


# The default tier runs the torch-free prepare cases and two of every other command; the slow
# tier (still run by the full suite) runs the rest. Each case is a real process forked from a
# server that imported torch once (tests/cli_forks.py): a fresh interpreter spent about 1.8 s of
# CPU per case on that import.
DEFAULT_TIER = {c.name for c in CASES if c.argv[0] == "prepare"} | {
    "train: --n_head 3 with --n_embd 128", "train: run directory that already holds a run",
    "resume: truncated trainer state", "resume: data with more characters than the model",
    "generate: a tensor of the wrong shape", "generate: tokenizer larger than the model",
    "inspect: --seq-len beyond the context", "export-hf: into a non-empty folder", "import-hf: a folder that is not GPT-2",
    "import-hf: a weight of the wrong shape", "debug: generate, weights file missing",
    "resume: the data file changed in place (same size)", "generate: config.json without activation",
    "plot: --out onto the training log", "walkthrough: --preset smoke",
    "plot: --out onto its own log with --force", "resume: --max_steps below the run's step",
    "resume: a run killed while it started", "export-hf: into the run it reads",
}


@pytest.fixture(scope="session")
def outcomes(tiny_run, tmp_path_factory) -> dict[str, Outcome]:
    """The default tier's cases, each run once, two processes at a time."""
    cases = [c for c in CASES if c.name in DEFAULT_TIER]
    return run_all(cases, tiny_run, tmp_path_factory.mktemp("bad-input-cases"), tmp_path_factory.mktemp("bad-input-cache"))


@pytest.fixture(scope="session")
def slow_outcomes(tiny_run, tmp_path_factory) -> dict[str, Outcome]:
    cases = [c for c in CASES if c.name not in DEFAULT_TIER]
    return run_all(cases, tiny_run, tmp_path_factory.mktemp("bad-input-cases"), tmp_path_factory.mktemp("bad-input-cache"))


def test_at_least_forty_distinct_cases_over_every_subcommand():
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names) >= 40
    commands = {c.argv[0] for c in CASES}
    assert commands >= {"prepare", "train", "generate", "inspect", "export-hf", "import-hf"}
    assert sum("--resume" in c.argv for c in CASES) >= 5
    assert DEFAULT_TIER <= set(names)


def _check(case: Case, out: Outcome) -> None:
    problems = case_problems(case, out)
    assert not problems, f"{problems}\nstderr:\n{out.stderr[-3000:]}"


FAST = [c for c in CASES if c.name in DEFAULT_TIER]
SLOW = [c for c in CASES if c.name not in DEFAULT_TIER]


@pytest.mark.parametrize("case", FAST, ids=[c.name for c in FAST])
def test_bad_input_is_one_clear_line_and_changes_nothing(case, outcomes):
    _check(case, outcomes[case.name])


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=[c.name for c in SLOW])
def test_more_bad_input_is_one_clear_line_and_changes_nothing(case, slow_outcomes):
    _check(case, slow_outcomes[case.name])


def test_train_reads_bad_bytes_with_errors_replace(tmp_path):
    """The invalid-UTF-8 error tells the user to pass --errors replace; train takes it too."""
    import os
    import subprocess
    import sys

    (tmp_path / "bad.txt").write_bytes(b"hello world \xff bad byte\n" * 400)
    env = {**os.environ, "SCRATCHLM_CACHE": str(tmp_path / "cache")}
    base = [sys.executable, "-m", "scratchlm", "train", "--data", str(tmp_path / "bad.txt"), "--max_steps", "1",
            "--eval_interval", "0", "--sample_tokens", "0", "--progress", "quiet", "--threads", "1"]
    strict = subprocess.run([*base, "--out_dir", str(tmp_path / "a")], capture_output=True, text=True, env=env)
    assert strict.returncode == 2 and "--errors replace" in strict.stderr
    replaced = subprocess.run([*base, "--out_dir", str(tmp_path / "b"), "--errors", "replace"], capture_output=True,
                              text=True, env=env)
    assert replaced.returncode == 0, replaced.stderr
    from scratchlm.checkpoint import load_model

    _, tok, _ = load_model(tmp_path / "b")
    assert "\ufffd" in tok.chars  # the bad byte became the replacement character
