"""Sizes before memory (scratchlm.machine.memory): one estimate of parameter, activation, KV-cache and
output bytes, checked against an independent count of real tensors, and used by every command
that builds a model or a batch, before anything is allocated: one error line naming the size and
what to lower, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scratchlm.cli import main as cli
from scratchlm.inside.introspect import memory_estimate
from scratchlm.machine import memory
from scratchlm.machine.memory import Workload, footprint
from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT, KVCache

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = dict(vocab_size=37, block_size=12, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
SHAPES = [dict(), dict(tie_weights=True), dict(pos_embedding="rope", norm="rmsnorm", activation="swiglu", n_inner=48,
                                                 lm_head_bias=False, qkv_bias=True), dict(n_layer=3, mlp_bias=False)]


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ------------------------------------------------------------------ the estimate against real tensors


@pytest.mark.parametrize("shape", SHAPES, ids=["plain", "tied", "rope-swiglu", "3-layers"])
def test_parameter_bytes_are_those_of_a_model_built_for_real(shape):
    config = GPTConfig(**{**TINY, **shape})
    model = GPT(config)
    assert footprint(config).parameters == _bytes(model.parameters())  # float32, each tensor once (tied: once)


def test_training_parameter_bytes_are_weights_gradients_and_adamw_state_of_a_real_step():
    torch.manual_seed(0)
    config = GPTConfig(**TINY)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, config.vocab_size, (2, config.block_size))
    _, loss = model(idx, idx)
    loss.backward()
    optimizer.step()
    moments = [t for state in optimizer.state.values() for k, t in state.items() if k in ("exp_avg", "exp_avg_sq")]
    held = _bytes(model.parameters()) + _bytes(p.grad for p in model.parameters()) + _bytes(moments)
    assert footprint(config, Workload(training=True)).parameters == held


@pytest.mark.parametrize("rows", [1, 3])
def test_kv_cache_bytes_are_those_of_a_real_cache(rows):
    config = GPTConfig(**TINY)
    cache = KVCache(config, rows)
    assert footprint(config, Workload(rows=rows), param_bytes=0).kv_cache == _bytes([cache.k, cache.v])


def test_output_bytes_of_a_forward_are_its_logits_and_ids():
    config = GPTConfig(**TINY)
    idx = torch.randint(0, config.vocab_size, (3, 7))
    with torch.no_grad():
        logits, _ = GPT(config)(idx)
    assert logits.shape[1] == 7, "the model returned logits for a part of the batch only; count those"
    assert footprint(config, Workload(batch=3, seq_len=7), param_bytes=0).output == _bytes([logits, idx])


@pytest.mark.parametrize("n_layer", [1, 2, 5])
def test_training_activations_for_any_depth_match_the_layer_by_layer_count(n_layer):
    """footprint works from one and two layers out (n_layer may be 10**9); introspect's
    memory_estimate lists every layer, and is itself compared with what autograd saves."""
    config = GPTConfig(**{**TINY, "n_layer": n_layer})
    direct = max(e.activations + e.loss_temporaries for e in
                 (memory_estimate(config, 4, 9, "fp32", attention) for attention in ("sdpa", "compiled")))
    assert footprint(config, Workload(batch=4, seq_len=9, training=True), param_bytes=0).activations == direct


def test_a_huge_config_is_estimated_without_building_anything():
    config = GPTConfig(**{**TINY, "n_layer": 10**9, "vocab_size": 10**9})
    need = footprint(config, Workload(batch=8, seq_len=12, training=True, rows=2))
    per_layer = GPTConfig(**{**TINY, "n_layer": 2}).n_embd  # a sanity floor: every layer's residual stream
    assert need.activations > 10**9 * 8 * 12 * per_layer * 4 and need.parameters > 16 * 10**9 * 16
    assert need.total == need.parameters + need.activations + need.kv_cache + need.output


def test_the_error_names_the_size_its_parts_and_the_knobs(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    with pytest.raises(memory.UserError) as caught:
        memory.check_fits(memory.Footprint(parameters=2_000, output=500), "cpu", "a thing", "--size")
    assert str(caught.value) == ("a thing needs about 2.5 KB (parameters 2.0 KB + output 500 bytes), but cpu has "
                                 "1.0 KB free; lower --size")
    memory.check_fits(memory.Footprint(parameters=1_000), "cpu", "a thing", "--size")  # exactly what is free: fits


# ------------------------------------------------------------------ every command checks first

TEXT = "the king and the queen speak of love and night, and the night is long.\n" * 30
RUN_MODEL = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16", "--no-lm_head_bias"]
QUIET = ["--eval_interval", "0", "--eval_iters", "1", "--sample_tokens", "0", "--progress", "quiet", "--threads", "1"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A folder with a text and a 2-step run of a tiny char model."""
    base = tmp_path_factory.mktemp("memory-sizes")
    (base / "text.txt").write_text(TEXT, encoding="utf-8")
    saved = os.environ.get("SCRATCHLM_CACHE")
    os.environ["SCRATCHLM_CACHE"] = str(base / "cache")
    try:
        assert cli.main(["train", "--data", str(base / "text.txt"), "--tokenizer", "char", "--max_steps", "2",
                         "--batch_size", "2", *RUN_MODEL, *QUIET, "--out_dir", str(base / "run")]) == 0
    finally:
        os.environ.pop("SCRATCHLM_CACHE") if saved is None else os.environ.__setitem__("SCRATCHLM_CACHE", saved)
    return base


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` but scratchlm's own caches (train prepares its data there first)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).parts[0] != "cache"}


FREE = 2_000_000
"""Bytes the checks are told are free (memory.available_bytes): the tiny model (about 5,000
parameters) fits many times over, in training too; each command's large size does not."""


def _commands(b: Path, out: Path) -> dict[str, tuple[list[str], list[str], str]]:
    """name -> (argv that fits in FREE, the same with one size too large, the knob the error names)."""
    run, text = str(b / "run"), str(b / "text.txt")
    train = ["train", "--data", text, "--tokenizer", "char", "--max_steps", "1", *RUN_MODEL, *QUIET, "--out_dir"]
    init = ["train", "--init_from", run, "--data", text, "--max_steps", "1", *QUIET, "--out_dir"]
    gen = ["generate", "--checkpoint", run, "--max-new-tokens", "4", "--seed", "1", "--prompt", "the"]
    return {
        "inspect a preset": (["inspect", "-B", "8"], ["inspect", "-B", "20000"], "--batch-size"),
        "inspect a checkpoint": (["inspect", "--checkpoint", run, "-B", "2"], ["inspect", "--checkpoint", run, "-B", "900"],
                                 "--batch-size"),
        "train": ([*train, str(out / "a"), "--batch_size", "2"], [*train, str(out / "b"), "--batch_size", "400"],
                  "--batch_size"),
        "train --init_from": ([*init, str(out / "c"), "--batch_size", "2"], [*init, str(out / "d"), "--batch_size", "400"],
                              "--batch_size"),
        "generate": ([*gen, "--num-samples", "2"], [*gen, "--num-samples", "900"], "--num-samples"),
        "eval": (["eval", "--checkpoint", run, "--data", text, "--batch-size", "2"],
                 ["eval", "--checkpoint", run, "--data", text, "--batch-size", "400"], "--batch-size"),
    }


def test_attention_maps_refuse_a_prompt_whose_maps_do_not_fit(base, tmp_path, monkeypatch, capsys):
    """Every layer's (T, T) weights for a 15-token prompt (about 20 KB here) against 8 KB free; 3
    tokens (about 3 KB) fit. The model's own load is checked elsewhere (load_model), off here."""
    from scratchlm import checkpoint

    monkeypatch.setattr(checkpoint, "check_model_fits", lambda *args, **kwargs: None)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 8_000)
    argv = ["attention", "--checkpoint", str(base / "run"), "--out"]
    assert cli.main([*argv, str(tmp_path / "b.png"), "--prompt", "the king and th"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the attention maps of 15 tokens needs about" in err[0] and "prompt" in err[0], err
    assert list(tmp_path.iterdir()) == []
    assert cli.main([*argv, str(tmp_path / "a.png"), "--prompt", "the"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["inspect a preset", "inspect a checkpoint", "train", "train --init_from", "generate",
                                  "eval"])
def test_each_command_refuses_a_size_that_does_not_fit_and_runs_one_that_does(base, tmp_path, monkeypatch, capsys,
                                                                               name):
    monkeypatch.setattr(memory, "available_bytes", lambda device: FREE)
    monkeypatch.setenv("SCRATCHLM_CACHE", str(base / "cache"))
    fits, too_big, knob = _commands(base, tmp_path)[name]
    before = _tree(base)
    assert cli.main(too_big) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "needs about" in err[0] and knob in err[0], err
    assert list(tmp_path.iterdir()) == [] and _tree(base) == before  # nothing made, nothing changed
    assert cli.main(fits) == 0, capsys.readouterr().err


def _hf_copy(base: Path, tmp_path: Path, **config) -> Path:
    """A GPT-2 folder as save_pretrained writes it (1 layer, C=16, V=50): config.json with
    `config` over it, random weights under GPT-2's names (Conv1D matrices stored (in, out))."""
    from safetensors.torch import save_file

    hf = tmp_path / "hf"
    hf.mkdir()
    spec = dict(model_type="gpt2", vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                tie_word_embeddings=False)
    (hf / "config.json").write_text(json.dumps({**spec, **config}))
    c, h = 16, "transformer.h.0."
    shapes = {"transformer.wte.weight": (50, c), "transformer.wpe.weight": (16, c), "lm_head.weight": (50, c),
              "transformer.ln_f.weight": (c,), "transformer.ln_f.bias": (c,), h + "ln_1.weight": (c,),
              h + "ln_1.bias": (c,), h + "ln_2.weight": (c,), h + "ln_2.bias": (c,), h + "attn.c_attn.weight": (c, 3 * c),
              h + "attn.c_attn.bias": (3 * c,), h + "attn.c_proj.weight": (c, c), h + "attn.c_proj.bias": (c,),
              h + "mlp.c_fc.weight": (c, 4 * c), h + "mlp.c_fc.bias": (4 * c,), h + "mlp.c_proj.weight": (4 * c, c),
              h + "mlp.c_proj.bias": (c,)}
    save_file({k: 0.02 * torch.randn(v) for k, v in shapes.items()}, str(hf / "model.safetensors"),
              metadata={"format": "pt"})
    return hf


@pytest.mark.parametrize("field, value, words", [
    ("vocab_size", 10**9, ["needs about", "vocab_size"]),  # was a traceback: a 96 GB allocation
    ("n_layer", 10**9, ["needs about", "n_layer"]),  # was minutes of building, memory growing
    ("n_layer", 50_000, ["asks for 50,000 layers", "the weights hold layers 0..0"]),  # fits: the weights say no
    ("n_embd", 10**6, ["needs about", "n_embd"])])
def test_import_hf_checks_the_config_before_reading_or_building(base, tmp_path, capsys, field, value, words):
    hf = _hf_copy(base, tmp_path, **{field: value})
    before = _tree(tmp_path)
    assert cli.main(["import-hf", str(hf), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and all(w in err[0] for w in words), err
    assert _tree(tmp_path) == before and not (tmp_path / "out").exists()


def test_import_and_export_refuse_what_does_not_fit_and_take_what_does(base, tmp_path, monkeypatch, capsys):
    hf = _hf_copy(base, tmp_path)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    assert cli.main(["import-hf", str(hf), str(tmp_path / "a")]) == 2
    assert "importing a model of" in capsys.readouterr().err and not (tmp_path / "a").exists()
    monkeypatch.setattr(memory, "available_bytes", lambda device: FREE)
    assert cli.main(["import-hf", str(hf), str(tmp_path / "a")]) == 0
    calls = []

    def free(device):
        calls.append(device)
        return FREE if len(calls) == 1 else 1000  # the load fits; the export's copies do not

    monkeypatch.setattr(memory, "available_bytes", free)
    assert cli.main(["export-hf", str(base / "run"), str(tmp_path / "e")]) == 2
    assert "exporting a model of" in capsys.readouterr().err and not (tmp_path / "e").exists()


# ------------------------------------------------------------------ the reported cases, as a user types them


@pytest.mark.slow
@pytest.mark.parametrize("argv, words", [
    (["inspect", "--batch-size", "1000000000"], ["tracing a batch of 1,000,000,000 x 16 tokens", "--batch-size"]),
    (["inspect", "--seq-len", "256", "--batch-size", "100000000"], ["needs about", "--seq-len"]),
    (["generate", "--checkpoint", "RUN", "--num-samples", "1000000000", "--prompt", "a"], ["--num-samples"]),
])
def test_the_reported_sizes_are_one_line_on_any_machine(base, argv, words):
    """Sizes no machine has: a real process, one line, exit 2, no traceback."""
    argv = [a.replace("RUN", str(base / "run")) for a in argv]
    env = {**os.environ, "SCRATCHLM_CACHE": str(base / "cache")}
    done = subprocess.run([sys.executable, "-m", "scratchlm", *argv], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and all(w in lines[0] for w in words), done.stderr


def test_a_meta_model_costs_about_the_module_bytes_the_estimate_says():
    """A model on the meta device holds no weights, but each block's Python objects: measured here
    with tracemalloc (Python's allocations) for 40 more layers, within a factor of two of the
    estimate's figure."""
    import tracemalloc

    def traced(n_layer: int) -> int:
        tracemalloc.start()
        with torch.device("meta"):
            model = GPT(GPTConfig(**{**TINY, "n_layer": n_layer}))
        used = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del model
        return used

    traced(2)  # the first model pays once for what every later one shares
    per_layer = (traced(60) - traced(20)) / 40
    assert memory.MODULE_BYTES_PER_LAYER / 2 < per_layer < memory.MODULE_BYTES_PER_LAYER * 2


@pytest.mark.parametrize("argv, words", [
    (["inspect", "--n_layer", "100000000"], ["the shapes of a model of 100,000,000 layers needs about", "--n_layer"]),
    (["walkthrough", "--n_layer", "100000000"], ["--n_layer 100,000,000", "at most 3,000"]),
])
def test_a_huge_n_layer_is_refused_before_a_model_is_made(capsys, argv, words):
    """Was: minutes of building blocks on the meta device while memory grew (10 GB in a minute)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err


GIB = 1024**3
STAT = "anon 3221225472\nfile 4294967296\nactive_file 1073741824\ninactive_file {inactive}\nshmem 0\n"


def _cgroup(folder: Path, limit: str, current: int, inactive: int | None) -> Path:
    """A hand-written cgroup v2 folder (the three files memory.py reads)."""
    folder.mkdir(exist_ok=True)
    (folder / "memory.max").write_text(limit + "\n")
    (folder / "memory.current").write_text(f"{current}\n")
    if inactive is not None:
        (folder / "memory.stat").write_text(STAT.format(inactive=inactive))
    return folder


@pytest.mark.parametrize("limit, current, inactive, free", [
    ("8589934592", 7 * GIB, 3 * GIB, 4 * GIB),  # 8 GiB limit, 7 in use of which 3 are inactive cache: 4 free
    ("8589934592", 7 * GIB, 0, 1 * GIB),  # no cache to drop
    ("8589934592", 7 * GIB, None, 1 * GIB),  # no memory.stat: the use as it stands
    ("8589934592", 9 * GIB, 0, 0),  # over the limit: nothing free, never negative
    ("max", 7 * GIB, 3 * GIB, None),  # no limit: the machine's figure decides
])
def test_a_containers_free_memory_leaves_out_the_cache_the_kernel_drops(tmp_path, monkeypatch, limit, current,
                                                                           inactive, free):
    """memory.current counts the page cache of every file read; after a run has read its data, a
    limit minus current alone refused runs that fit (the kernel drops inactive cache first)."""
    monkeypatch.setattr(memory, "CGROUP", str(_cgroup(tmp_path / "cg", limit, current, inactive)))
    assert memory._cgroup_free() == free


def test_cpu_memory_is_the_smaller_of_the_machines_and_the_containers(tmp_path, monkeypatch):
    (tmp_path / "meminfo").write_text("MemTotal: 67108864 kB\nMemFree: 1048576 kB\nMemAvailable: 20971520 kB\n")
    monkeypatch.setattr(memory, "MEMINFO", str(tmp_path / "meminfo"))  # 20 GiB available on the machine
    monkeypatch.setattr(memory, "CGROUP", str(_cgroup(tmp_path / "cg", str(8 * GIB), 7 * GIB, 3 * GIB)))
    assert memory.available_bytes("cpu") == 4 * GIB
    monkeypatch.setattr(memory, "CGROUP", str(_cgroup(tmp_path / "cg", "max", 7 * GIB, 3 * GIB)))
    assert memory.available_bytes("cpu") == 20 * GIB
    need = memory.Footprint(parameters=3 * GIB)  # fits the container once its inactive cache is counted free
    monkeypatch.setattr(memory, "CGROUP", str(_cgroup(tmp_path / "cg", str(8 * GIB), 7 * GIB, 3 * GIB)))
    memory.check_fits(need, "cpu", "this", "n_layer")
