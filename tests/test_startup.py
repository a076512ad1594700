"""Start-up: commands that need no model must not import torch (it costs seconds to load).

Each check runs in a fresh interpreter, since this test process has torch loaded already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = """
import contextlib, io, json, sys
import scratchlm.cli.main
argv = json.loads(sys.argv[1])
parser = scratchlm.cli.main.build_parser()
code = None
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = scratchlm.cli.main.main(argv)
    except SystemExit as exc:  # --help exits
        code = exc.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def _run_cli(argv: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argv)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _text_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.txt"
    path.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 60, encoding="utf-8")
    return path


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_prepare_does_not_import_torch(tmp_path: Path, tokenizer: str):
    argv = ["prepare", "--data", str(_text_file(tmp_path)), "--tokenizer", tokenizer, "--out", str(tmp_path / "out")]
    if tokenizer == "bpe":
        argv += ["--vocab-size", "300"]
    result = _run_cli(argv)
    assert result["code"] == 0
    assert (tmp_path / "out" / "meta.json").exists()  # it really ran
    assert result["torch"] is False


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["generate", "--help"]])
def test_help_does_not_import_torch(argv: list[str]):
    result = _run_cli(argv)
    assert result["code"] == 0
    assert result["torch"] is False


def test_probe_can_see_torch(tmp_path: Path):
    # The probe must be able to fail: a command that builds a model does import torch.
    result = _run_cli(["inspect", "--preset", "hand", "--seq-len", "3"])
    assert result["code"] == 0
    assert result["torch"] is True


def test_train_config_reexported():
    import scratchlm.training.train as train
    import scratchlm.training.train_config as train_config

    assert train.TrainConfig is train_config.TrainConfig
    assert train.TRAIN_PRESETS is train_config.TRAIN_PRESETS
    assert train.config_from_preset is train_config.config_from_preset
