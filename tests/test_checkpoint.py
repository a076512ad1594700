"""Checkpoints: round trips, the `latest` pointer, and survival of a writer that dies mid-save."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from scratchlm.errors import UserError
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm import checkpoint as ck

TINY = dict(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=16)


def _model(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, **overrides}))


def _save(run_dir, model, step, **kw):
    return ck.save_checkpoint(run_dir, step, model.state_dict(), ck.SavedConfig(model=model.config.to_dict()), **kw)


@pytest.mark.parametrize("tie", [False, True])
def test_round_trip_gives_identical_weights_and_logits(tmp_path, tie):
    model = _model(tie_weights=tie, lm_head_bias=not tie)
    _save(tmp_path, model, 7)
    loaded, tokenizer, info = ck.load_model(tmp_path)
    assert tokenizer is None and info["step"] == 7 and info["checkpoint"] == tmp_path / "ckpt-00000007"
    ref = model.state_dict()
    got = loaded.state_dict()
    assert set(ref) == set(got)
    for name in ref:
        assert torch.equal(ref[name], got[name]), name
    if tie:  # the tie must survive loading: one tensor, two uses
        assert loaded.lm_head.weight is loaded.transformer.wte.weight
    idx = torch.randint(0, 37, (2, 9))
    model.eval()
    assert torch.equal(model(idx)[0], loaded(idx)[0])


def test_latest_follows_newest_and_keep_last_prunes_only_after(tmp_path):
    model = _model()
    for step in (10, 20, 30):
        with torch.no_grad():
            model.transformer.wte.weight.fill_(step)
        _save(tmp_path, model, step, keep_last=2)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["ckpt-00000020", "ckpt-00000030"]
    assert (tmp_path / "latest").read_text().strip() == "ckpt-00000030"
    loaded, _, info = ck.load_model(tmp_path)
    assert info["step"] == 30 and torch.all(loaded.transformer.wte.weight == 30)
    # a checkpoint directory can be named directly too
    _, _, info = ck.load_model(tmp_path / "ckpt-00000020")
    assert info["step"] == 20


def test_training_state_round_trip_including_numpy_and_rng(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 37, (2, 8)), torch.randint(0, 37, (2, 8)))[1].backward()
    opt.step()
    state = {
        "step": 3,
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "torch_rng": torch.get_rng_state(),
        "data": {"pos": np.int64(5), "perm": np.arange(6, dtype=np.uint32)},
    }
    _save(tmp_path, model, 3, optimizer_state=opt.state_dict(), trainer_state=state)
    opt_state, got = ck.load_training_state(tmp_path / "ckpt-00000003")
    assert got["python_rng"] == state["python_rng"]
    np_state = got["numpy_rng"]
    assert np_state[0] == "MT19937" and np.array_equal(np_state[1], state["numpy_rng"][1])
    assert torch.equal(got["torch_rng"], state["torch_rng"])
    assert got["data"]["pos"] == 5 and got["data"]["perm"].dtype == np.uint32
    for a, b in zip(opt.state_dict()["state"].values(), opt_state["state"].values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"])


def test_loading_never_unpickles_objects(tmp_path):
    model = _model()
    ckpt = _save(tmp_path, model, 1, trainer_state={"step": 1}, optimizer_state={})
    torch.save({"evil": Path("/")}, ckpt / "trainer_state.pt")  # a pickled class instance
    with pytest.raises(UserError, match="trainer_state.pt"):
        ck.load_training_state(ckpt)


def test_truncated_or_mismatched_files_name_the_file(tmp_path):
    model = _model()
    ckpt = _save(tmp_path, model, 1)
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="model.safetensors"):
        ck.load_model(ckpt)
    weights.write_bytes(data)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model"]["n_embd"] = 32
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=r"model.safetensors.*config.json"):
        ck.load_model(ckpt)
    (ckpt / "config.json").write_text('{"model": {')
    with pytest.raises(UserError, match="config.json"):
        ck.load_model(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(UserError, match="config.json"):
        ck.load_model(ckpt)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no checkpoint"):
        ck.load_model(empty)


def test_writer_failing_halfway_leaves_latest_loadable(tmp_path, monkeypatch):
    model = _model()
    _save(tmp_path, model, 10, optimizer_state={"a": torch.zeros(3)}, trainer_state={"step": 10})
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def half_write_then_die(obj, path):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full (injected)")

    monkeypatch.setattr(ck, "_torch_save_durably", half_write_then_die)
    with torch.no_grad():
        model.transformer.wte.weight.add_(1.0)
    with pytest.raises(UserError, match=r"the write failed \(disk full \(injected\)\)"):  # one line in the CLI
        _save(tmp_path, model, 20, optimizer_state={"a": torch.zeros(3)}, trainer_state={"step": 20})
    assert (tmp_path / "latest").read_text().strip() == "ckpt-00000010"
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["ckpt-00000010"]
    loaded, _, info = ck.load_model(tmp_path)
    assert info["step"] == 10
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    monkeypatch.undo()
    _save(tmp_path, model, 20, optimizer_state={}, trainer_state={"step": 20})
    assert not list(tmp_path.glob(".tmp-*"))  # the next save cleans the leftovers
    assert ck.load_model(tmp_path)[2]["step"] == 20


_SAVER = textwrap.dedent(
    """
    import sys, torch
    from scratchlm import checkpoint as ck
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT
    run_dir = sys.argv[1]
    model = GPT(GPTConfig(vocab_size=4096, block_size=64, n_layer=2, n_head=4, n_embd=128))
    state = model.state_dict()
    step = 0
    while True:
        step += 1
        with torch.no_grad():
            for t in state.values():
                t.fill_(step)  # every tensor of checkpoint k holds the value k
        ck.save_checkpoint(run_dir, step, state, ck.SavedConfig(model=model.config.to_dict()),
                           optimizer_state={"m": torch.full((200000,), float(step))},
                           trainer_state={"step": step}, keep_last=2)
        if step == 1:  # from here on every kill must leave a whole latest, however slow the machine
            print("ready", flush=True)
    """
)


@pytest.mark.slow
def test_sigkill_at_random_instants_leaves_latest_loadable(tmp_path):
    """Kill a process that saves in a loop at random moments; `latest` must always load whole."""
    rng = random.Random(1234)
    run_dir = tmp_path / "run"
    script = tmp_path / "saver.py"
    script.write_text(_SAVER)
    checked = 0
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], stdout=subprocess.PIPE)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.2, 0.8))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        model, _, info = ck.load_model(run_dir)
        step = info["step"]
        for name, tensor in model.state_dict().items():
            assert torch.all(tensor == step), f"{name} mixes checkpoints"
        opt_state, trainer_state = ck.load_training_state(info["checkpoint"])
        assert trainer_state["step"] == step and torch.all(opt_state["m"] == step)
        checked += 1
    assert checked == 6


def test_save_model_checkpoint_is_loadable_and_refuses_to_overwrite(tmp_path):
    model = _model(tie_weights=True)
    out = ck.save_model_checkpoint(model, None, tmp_path / "imported", extra_config={"source": "test"})
    loaded, tok, info = ck.load_model(out)
    assert tok is None and info["step"] is None and info["config"]["source"] == "test"
    assert torch.equal(loaded.transformer.wte.weight, model.transformer.wte.weight)
    with pytest.raises(UserError, match="not empty"):
        ck.save_model_checkpoint(model, None, out)


def test_a_config_json_written_before_the_saved_config_type_reads_and_writes_back_byte_for_byte(tmp_path):
    """config.json as runs wrote it before SavedConfig (keys in this order, json.dumps indent 2),
    typed here by hand: every section reads back, and writing it again gives the same bytes; one
    from a weights-only import (an extra key, no train section, no step) too."""
    model = {"vocab_size": 37, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16}
    training = {
        "model": model, "train": {"lr": 0.001, "optimizer": "adamw"}, "data": {"data": "a.txt", "block_size": None},
        "data_sources": [{"path": "a.txt", "bytes": 12, "sha256": "ab" * 32}],
        "tokenizer": {"kind": "char", "vocab_size": 37, "bos_id": 35, "eos_id": 36}, "step": 7,
    }
    imported = {"model": model, "imported_from": "/models/gpt2", "tokenizer": {"kind": "gpt2", "vocab_size": 50257}}
    for name, values in (("training", training), ("imported", imported)):
        folder = tmp_path / name
        folder.mkdir()
        written = json.dumps(values, indent=2).encode("utf-8")
        (folder / ck.CONFIG_FILE).write_bytes(written)
        saved = ck.SavedConfig.read(folder)
        assert saved.model == model and saved.tokenizer == values["tokenizer"]
        assert saved.to_json() == written, name
    saved = ck.SavedConfig.read(tmp_path / "training")
    assert (saved.step, saved.train["lr"], saved.data_sources[0]["bytes"]) == (7, 0.001, 12)
    saved = ck.SavedConfig.read(tmp_path / "imported")
    assert (saved.step, saved.train, saved.extra) == (None, None, {"imported_from": "/models/gpt2"})


@pytest.mark.parametrize("section, value, kind", [
    ("data_sources", {}, "an object where a list"), ("train", ["lr"], "a list where an object"),
    ("tokenizer", "char", "a string where an object"), ("step", "7", "a string where a number"),
    ("step", True, "true or false where a number"),
])
def test_a_section_of_the_wrong_type_is_one_error_line_not_a_section_left_out(tmp_path, section, value, kind):
    """A damaged config.json whose section has the wrong type stops the reader with the file and
    the section named; dropping it would read as an older checkpoint without it, and a resume would
    then skip the check that it trains on the same data."""
    values = {"model": {"vocab_size": 37}, section: value}
    (tmp_path / ck.CONFIG_FILE).write_text(json.dumps(values), encoding="utf-8")
    with pytest.raises(UserError) as caught:
        ck.SavedConfig.read(tmp_path)
    assert str(caught.value) == f"{tmp_path / ck.CONFIG_FILE}: its {section!r} section is {kind} belongs; the file is damaged"


def test_saving_over_a_folder_leaves_only_the_new_one(tmp_path):
    """A second save of the tokenizer into the same place swaps the new folder in and removes the
    old one: the folder holds exactly what the new save wrote, and nothing else is left beside it
    (no `.old-*`, no temp folder)."""
    from scratchlm.checkpoint import save_tokenizer
    from scratchlm.text.tokenizer import CharTokenizer, load_tokenizer

    save_tokenizer(CharTokenizer("abc"), tmp_path)
    save_tokenizer(CharTokenizer("xyz"), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]
    assert load_tokenizer(tmp_path / "tokenizer").chars == ["x", "y", "z"]


# ------------------------------------------------------------------------------ mutation survivors (issue 21)


def test_saving_the_same_step_again_returns_its_folder_and_pruning_returns_what_went(tmp_path):
    model = _model()
    first = _save(tmp_path, model, 5)
    assert _save(tmp_path, model, 5) == first == tmp_path / "ckpt-00000005"  # a stop right after a save
    for step in (6, 7):
        _save(tmp_path, model, step)
    removed = ck.prune_checkpoints(tmp_path, keep_last=1)
    assert sorted(p.name for p in removed) == ["ckpt-00000005", "ckpt-00000006"]
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["ckpt-00000007"]


def test_a_weights_only_checkpoint_goes_into_a_folder_whose_parents_do_not_exist_yet(tmp_path):
    out = ck.save_model_checkpoint(_model(), None, tmp_path / "a" / "b" / "imported")
    assert ck.load_model(out)[2]["checkpoint"] == tmp_path / "a" / "b" / "imported"


def test_loaded_models_are_in_eval_mode_on_the_device_asked():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model = _model(dropout=0.5)
        _save(tmp, model.train(), 1)
        loaded, _, _ = ck.load_model(tmp, device="cpu")
        assert not loaded.training and all(not m.training for m in loaded.modules())
        idx = torch.randint(0, 37, (1, 8))
        assert torch.equal(loaded(idx)[0], loaded(idx)[0])  # no dropout between two calls


def test_which_configs_are_hugging_faces():
    assert ck.is_hf_config({"model_type": "gpt2"}) and ck.is_hf_config({"architectures": ["GPT2LMHeadModel"]})
    assert not ck.is_hf_config({"model": {"n_layer": 2}, "model_type": "gpt2"})  # ours, whatever else it holds
    assert not ck.is_hf_config({"step": 3}) and not ck.is_hf_config(["model_type"])


def test_a_bad_model_config_is_one_error_naming_the_file(tmp_path):
    model = _model()
    ckpt = _save(tmp_path, model, 1)
    config = json.loads((ckpt / "config.json").read_text())
    config["model"]["n_head"] = 3  # 16 is not divisible by 3
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"config\.json: bad model config \(.*n_head"):
        ck.load_model(tmp_path)


def test_a_refused_foreign_pickle_is_one_error_and_no_warning(tmp_path):
    """torch warns about a pickle protocol it did not write on its way to refusing the file; the
    user gets the refusal as one UserError and none of torch's warnings."""
    import pickle
    import warnings

    path = tmp_path / "trainer_state.pt"
    path.write_bytes(pickle.dumps({"step": 1}, protocol=4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UserError, match="trainer_state.pt: cannot read it"):
            ck._torch_load_safely(path)
    assert [str(w.message) for w in caught] == []
