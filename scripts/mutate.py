"""Mutation testing: change one thing in a module, run the tests that should notice, repeat.

    python scripts/mutate.py sampling                 # every mutant of scratchlm/generation/sampling.py
    python scripts/mutate.py model --max 60 --seed 1  # 60 of them, drawn at random
    python scripts/mutate.py generate --list          # only list the mutants
    python scripts/mutate.py --hand                   # the hand-made mutations (HAND_MUTATIONS)
    python scripts/mutate.py --hand --only decay keep # only those whose name holds "decay" or "keep"

Each mutant is one small edit of the module's source, found from its syntax tree: an arithmetic
or comparison operator swapped (+ and -, * and /, < and <=, == and !=, ...), `and` for `or`, a
`not` dropped, a number nudged (0 to 1, n to n + 1, a float times 1.5), True for False, a return
value replaced by None, a call made for its effect removed. The module is edited in a copy of the
package (the checkout is never touched), the module's fast tests run against the copy in a
fresh `pytest -x` process, and the mutant is killed when they fail (or hang past --timeout, also
counted as killed and marked). Survivors are printed with their line and edit: each is a gap in
the tests, or an equivalent mutant (an edit that changes nothing observable), to be told apart
by reading it.

Not part of CI. Cost: one pytest process per mutant (about 3 s to import torch, plus the tests),
two at a time: a module of ~100 mutants with fast tests takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODULES: dict[str, tuple[str, list[str]]] = {
    # name: (file under scratchlm/, the tests that should notice a change to it)
    "model": ("model/gpt.py", ["tests/test_model.py", "tests/test_reference.py"]),
    "sampling": ("generation/sampling.py", ["tests/test_sampling.py"]),
    # the generation loops (the Engine); generation/generate.py only hands its calls to one
    "generate": ("generation/engine.py", ["tests/test_generate.py", "tests/test_generate_text.py", "tests/test_engine.py",
                                 "tests/test_decode_step.py::test_generation_uses_it_and_keeps_greedy_tokens",
                                 "tests/test_decode_step.py::test_greedy_generation_crosses_the_context_in_chunks_and_keeps_the_plain_tokens"]),
    "fused_loss": ("model/fused_loss.py", ["tests/test_fused_loss.py"]),
    "train": ("training/train.py", ["tests/test_train.py", "tests/test_fused_loss.py::test_training_with_and_without_fused_loss_gives_the_same_losses",
                           "-m", "not slow"]),
    # checkpoint's writes under failure (full disk, kills, stale temp folders) are tested in test_crash
    "checkpoint": ("checkpoint.py", ["tests/test_checkpoint.py", "tests/test_crash.py"]),
    "data": ("data/preparation.py", ["tests/test_data_preparation.py", "tests/test_data_bad_input.py"]),
}

HAND_MUTATIONS = [
    # (name, file, old text, new text, tests): the mutations of issue 21, each of which passed the
    # suite once; `--hand` applies each and names the tests that now fail it
    ("cached step fed the previous token", "generation/engine.py",
     "return decoder.last_logits(seq[:, -1:], cache)", "return decoder.last_logits(seq[:, -2:-1], cache)",
     ["tests/test_decoding.py::test_bfloat16_cached_steps_match_the_uncached_loop",
      "tests/test_decoding.py::test_generate_text_in_bfloat16_and_on_the_command_line"]),
    ("apply_fsdp returns the model unwrapped", "training/distributed.py",
     "def apply_fsdp(model: GPT, device: torch.device, d: Dist) -> torch.nn.Module:\n",
     "def apply_fsdp(model: GPT, device: torch.device, d: Dist) -> torch.nn.Module:\n    return model\n",
     ["tests/test_distributed.py::test_fsdp2_on_two_gloo_processes_trains_and_saves_a_full_checkpoint"]),
    ("autocast a null context", "training/precision.py",
     "def autocast(device: torch.device, dtype: str):\n",
     "def autocast(device: torch.device, dtype: str):\n    return nullcontext()\n",
     ["tests/test_train.py::test_bfloat16_autocast_and_activation_checkpointing_train_on_cpu"]),
    ("activation checkpointing off", "model/gpt.py",
     "if self.gradient_checkpointing and self.training", "if False and self.gradient_checkpointing and self.training",
     ["tests/test_train.py::test_bfloat16_autocast_and_activation_checkpointing_train_on_cpu"]),
    ("the 16-bit path's dh scaled by 0.75", "model/fused_loss.py",
     "dh[start:end] = (g @ wc[:, :C]) * w_c[:, None].to(compute_dtype)  # (n, C)",
     "dh[start:end] = (g @ wc[:, :C]) * w_c[:, None].to(compute_dtype) * (0.75 if compute_dtype != acc else 1.0)",
     ["tests/test_fused_loss.py::test_bf16_autocast_is_close_to_float32_on_rounded_inputs"]),
    ("the fused-loss flag ignored", "training/train.py",
     "return_logits=not cfg.fused_loss", "return_logits=False",
     ["tests/test_fused_loss.py::test_training_with_and_without_fused_loss_gives_the_same_losses"]),
    ("generation without inference mode", "generation/engine.py",
     "    @torch.inference_mode()\n    def _tokens(", "    def _tokens(",
     ["tests/test_generate.py::test_generation_restores_training_mode_and_needs_no_grad"]),
    ("gemv never splits its rows", "kernels/__init__.py",
     "return n_out * k >= GEMV_PARALLEL_MIN", "return False",
     ["tests/test_kernels.py::test_gemv_splits_rows_between_threads_as_documented"]),
    ("validation = the last documents, no RNG", "data/preparation.py",
     "is_val[np.random.default_rng(cfg.seed).permutation(n_docs)[:n_val]] = True", "is_val[n_docs - n_val:] = True",
     ["tests/test_data_preparation.py::test_prepare_documents_split_is_seeded_and_whole"]),
    ("decode step's rows not shared out (omp for removed)", "kernels/decode_step.c",
     "#pragma omp for schedule(guided, 32)\n", "",
     ["tests/test_decode_step.py::test_every_matrix_row_is_computed_once_and_two_threads_share_them"]),
    # issue 30's survivors (each passed the suite once); a file under scripts/ is named from the repository root
    ("beam search without inference mode", "generation/engine.py",
     "    @torch.inference_mode()\n    def beam_search(", "    def beam_search(",
     ["tests/test_beam_and_stop_strings.py::test_beam_search_builds_no_graph"]),
    ("kill_resume counts a kill that left no checkpoint as identical", "scripts/kill_resume.py",
     "    same = None  # no checkpoint yet: nothing to compare, and counted as such, not as identical\n",
     "    same = True\n",
     ["tests/test_kill_before_checkpoint.py::test_the_held_run_had_made_its_folder_and_nothing_more_and_is_judged_so"]),
    ("--init_from loads the source run's AdamW state", "training/train.py",
     "        state = restore_run(setup, parts) if setup.resume_ckpt is not None else TrainState()\n",
     "        state = restore_run(setup, parts) if setup.resume_ckpt is not None else TrainState()\n"
     "        if setup.source is not None:\n            from scratchlm import checkpoint as ckpt_io\n\n"
     "            parts.optimizer.load_state_dict(ckpt_io.load_training_state("
     "ckpt_io.resolve_checkpoint(cfg.init_from))[0][\"optimizer\"])\n",
     ["tests/test_schedule_and_saving.py::test_init_from_starts_a_fresh_adamw"]),
    ("resume on another tokenizer: the tokenizer comparison removed", "training/setup.py",
     '    elif tokenizer and (tokenizer.get("kind")', '    elif False and tokenizer and (tokenizer.get("kind")',
     ["tests/test_schedule_and_saving.py::test_a_resume_on_another_tokenizer_is_refused_and_changes_nothing"]),
    ("--decay_steps ignored", "training/train.py",
     "end = cfg.decay_steps or cfg.max_steps", "end = cfg.max_steps",
     ["tests/test_schedule_and_saving.py::test_decay_steps_ends_the_decay_there_and_not_at_max_steps"]),
    ("keep_last not passed when training saves", "training/resume.py",
     "keep_last=cfg.keep_last or None", "keep_last=None",
     ["tests/test_schedule_and_saving.py::test_training_keeps_only_the_last_checkpoints_it_is_told_to"]),
    ("prune_checkpoints deletes the checkpoint latest names", "checkpoint.py",
     "keep = {latest_checkpoint(run_dir)}", "keep = set()",
     ["tests/test_schedule_and_saving.py::test_pruning_never_deletes_the_checkpoint_latest_names"]),
    ("mid-run validation on the training tokens", "training/evaluation.py",
     "stream = RankBatches(val_tokens,", "stream = RankBatches(setup.train_tokens,",
     ["tests/test_validation_and_windows.py::test_mid_run_validation_is_the_validation_loss_with_dropout_off"]),
    ("mid-run validation with dropout on", "training/evaluation.py",
     "    with eval_mode(model):\n        total = torch.zeros((), device=device)\n",
     "    with nullcontext():\n        total = torch.zeros((), device=device)\n",
     ["tests/test_validation_and_windows.py::test_mid_run_validation_is_the_validation_loss_with_dropout_off"]),
    ("random windows never start at the last position", "data/shards.py",
     "rng.integers(0, self.part - T, size=B)", "rng.integers(0, self.part - T - 1, size=B)",
     ["tests/test_validation_and_windows.py::test_random_windows_start_everywhere_the_last_start_included"]),
    ("text cut at the last stop string instead of the first", "generation/text_rows.py",
     "self._cut = min(hits)", "self._cut = max(hits)",
     ["tests/test_beam_and_stop_strings.py::test_the_text_ends_before_the_first_stop_string_it_holds"]),
    ("MFU not divided by the world size", "training/progress.py",
     "tok_s / self.setup.d.world_size / self.peak", "tok_s / self.peak",
     ["tests/test_ddp_accounting.py::test_two_processes_count_both_processes_tokens_and_report_mfu_per_device"]),
    ("tokens per step not multiplied by the world size", "training/setup.py",
     "self.cfg.grad_accum * self.d.world_size", "self.cfg.grad_accum",
     ["tests/test_ddp_accounting.py::test_two_processes_count_both_processes_tokens_and_report_mfu_per_device"]),
    ("a saved model config missing a field loads with defaults (complete=True flipped)", "checkpoint.py",
     'GPTConfig.from_dict(self.model, complete=True)', 'GPTConfig.from_dict(self.model, complete=False)',
     ["tests/test_schedule_and_saving.py::test_a_saved_model_config_missing_a_field_is_refused"]),
    ("a saved training config missing a field resumes with defaults (complete=True flipped)", "training/resume.py",
     "TrainConfig.from_dict(saved, complete=True)", "TrainConfig.from_dict(saved, complete=False)",
     ["tests/test_schedule_and_saving.py::test_a_run_whose_saved_training_config_misses_a_field_is_not_resumed"]),
    ("the playground lists a symlink to a run inside --runs", "serve/library.py",
     "if child.is_symlink() or not child.is_dir() or child.resolve().parent != self.runs:",
     "if not child.is_dir() or child.resolve().parent != self.runs:",
     ["tests/test_serve_hardening.py::test_a_symlink_to_a_run_inside_the_folder_is_not_listed"]),
    ("a run name holding '..' reaches a run", "serve/library.py",
     r'(name in (".", "..") or any(c in name for c in "/\\\0"))', r'(any(c in name for c in "/\\\0"))',
     ["tests/test_serve_hardening.py::test_a_run_name_that_is_a_path_never_reaches_a_run"]),
    # the nine of issue 49 (serve guard, file safety, GGUF export, streaming prepare), each of which
    # passed the suite once
    ("the JSON content-type check skipped for DELETE", "serve/guard.py",
     'if scope["method"] not in ("GET", "HEAD"):', 'if scope["method"] not in ("GET", "HEAD", "DELETE"):',
     ["tests/test_serve_hardening.py::test_any_method_with_a_body_that_is_not_json_is_refused_as_a_post_is"]),
    ("at the connection cap the connection that waited least goes", "serve/guard.py",
     "oldest = min(waiting, key=lambda c: c.waiting_since, default=self)",
     "oldest = max(waiting, key=lambda c: c.waiting_since, default=self)",
     ["tests/test_serve_hardening.py::test_past_the_cap_the_connection_that_waited_longest_goes"]),
    ("the JSON media type compared case-sensitively", "serve/guard.py",
     'headers.get(b"content-type", b"").split(b";")[0].strip().lower()',
     'headers.get(b"content-type", b"").split(b";")[0].strip()',
     ["tests/test_serve_hardening.py::test_the_json_media_type_is_read_in_any_case"]),
    ("the torn-log newline search takes in the final byte", "fileio.py",
     'cut = tail.rfind(b"\\n", 0, len(tail) - 1)', 'cut = tail.rfind(b"\\n")',
     ["tests/test_output_paths.py::test_a_torn_last_record_is_cut_by_hand"]),
    ("a durable atomic_write neither flushes nor fsyncs before its rename", "fileio.py",
     "            if durable:\n                f.flush()\n                os.fsync(f.fileno())\n", "",
     ["tests/test_fileio.py::test_a_durable_write_reaches_the_disk_before_its_rename"]),
    ("the GGUF position table takes the matrices' form", "gguf/export.py",
     'if len(shape) == 1 or name == "position_embd.weight":', "if len(shape) == 1:",
     ["tests/test_gguf_export.py::test_the_position_table_stays_float32_and_exact_in_every_form"]),
    ("a tied GPT-NeoX model exported without output.weight", "gguf/tensors.py",
     'if not cfg.tie_weights or arch == "gptneox":', "if not cfg.tie_weights:",
     ["tests/test_gguf_export.py::test_a_tied_gpt_neox_model_gets_a_head_of_its_own"]),
    ("a byte-fallback BPE accepted by the GGUF export", "gguf/vocab.py",
     'and not model.get("byte_fallback"))', "and True)",
     ["tests/test_gguf_export.py::test_a_bpe_that_llama_cpps_gpt2_pre_tokenizer_would_encode_otherwise_is_refused"]),
    ("the streaming cut search counts U+001C..U+001F as no white space", "data/cutting.py",
     r'_NOT_SPACE = r"[^\p{White_Space}\x1c-\x1f]"', r'_NOT_SPACE = r"[^\p{White_Space}]"',
     ["tests/test_data_streaming.py::test_separators_u001c_to_u001f_are_white_space_to_the_cut_search"]),
    ("the loop's token count only this process's rows", "training/batches.py",
     "self.drawn += x.numel()", "self.drawn += x[self.rank :: self.world_size].numel()",
     ["tests/test_ddp_accounting.py::test_two_processes_count_both_processes_tokens_and_report_mfu_per_device"]),
]


def _repo_path(module_file: str) -> str:
    """Where a mutated file lies in the repository: under scratchlm/, unless named from the root (scripts/)."""
    return module_file if module_file.startswith("scripts/") else f"scratchlm/{module_file}"

_SWAPS = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.And: ast.Or, ast.Or: ast.And,
}


@dataclass
class Mutant:
    line: int
    what: str
    source: str  # the whole mutated module


@dataclass
class Outcome:
    line: int
    what: str
    killed: bool
    timed_out: bool
    seconds: float


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first))
    return ids


def _edits(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """(description, replacement node) for each mutation of `node` alone."""
    out = []
    if isinstance(node, ast.BinOp) and type(node.op) in _SWAPS:
        new = _SWAPS[type(node.op)]()
        out.append((f"{type(node.op).__name__} -> {type(new).__name__}", ast.BinOp(node.left, new, node.right)))
    elif isinstance(node, ast.BoolOp):
        new = _SWAPS[type(node.op)]()
        out.append((f"{type(node.op).__name__} -> {type(new).__name__}", ast.BoolOp(new, node.values)))
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _SWAPS:
        new = _SWAPS[type(node.ops[0])]()
        out.append((f"{type(node.ops[0]).__name__} -> {type(new).__name__}", ast.Compare(node.left, [new], node.comparators)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not dropped", node.operand))
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        out.append((f"{node.value} -> {not node.value}", ast.Constant(not node.value)))
    elif isinstance(node, ast.Constant) and isinstance(node.value, int):
        out.append((f"{node.value} -> {node.value + 1}", ast.Constant(node.value + 1)))
    elif isinstance(node, ast.Constant) and isinstance(node.value, float):
        new = 1.0 if node.value == 0 else node.value * 1.5
        out.append((f"{node.value} -> {new}", ast.Constant(new)))
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        out.append(("return value -> None", ast.Return(ast.Constant(None))))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        out.append(("call removed", ast.Pass()))
    return out


def mutants(path: Path) -> list[Mutant]:
    """Every single-edit mutant of the module at `path` (docstrings, annotations and the
    `if TYPE_CHECKING`-style imports are left alone)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    tree = ast.parse(text)
    skip = _docstring_nodes(tree)
    annotations = set()
    for node in ast.walk(tree):
        for ann in [getattr(node, "annotation", None), getattr(node, "returns", None)]:
            if ann is not None:
                annotations.update(id(n) for n in ast.walk(ann))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip or id(node) in annotations or not hasattr(node, "lineno"):
            continue
        for what, replacement in _edits(node):
            start = offsets[node.lineno - 1] + _char_col(lines[node.lineno - 1], node.col_offset)
            end = offsets[node.end_lineno - 1] + _char_col(lines[node.end_lineno - 1], node.end_col_offset)
            new_code = ast.unparse(replacement)
            if isinstance(node, ast.expr):
                new_code = f"({new_code})"
            source = text[:start] + new_code + text[end:]
            try:
                compile(source, str(path), "exec")
            except SyntaxError:
                continue
            found.append(Mutant(node.lineno, what, source))
    found.sort(key=lambda m: (m.line, m.what))
    return found


def _char_col(line: str, byte_col: int) -> int:
    """ast's col_offset counts UTF-8 bytes; the source string counts characters."""
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def _mutated_checkout(workdir: Path, module_file: str, source: str) -> tuple[Path, Path]:
    """(folder to remove, repository copy to run in): the package, tests, scripts and project file
    copied, one module replaced by `source`, and ../shared linked as beside the checkout. The
    tests run inside the copy, so `import scratchlm` finds the mutant (Python puts the working
    folder first on sys.path) and never the checkout."""
    base = Path(tempfile.mkdtemp(prefix="mutant-", dir=workdir))
    copy = base / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "results")
    for name in ("scratchlm", "tests", "scripts", "benchmarks"):
        shutil.copytree(REPO / name, copy / name, ignore=ignore)
    shutil.copy2(REPO / "pyproject.toml", copy / "pyproject.toml")
    if (REPO.parent / "shared").exists():
        (base / "shared").symlink_to(REPO.parent / "shared")
    (copy / _repo_path(module_file)).write_text(source, encoding="utf-8")
    return base, copy


def _pytest(copy: Path, tests: list[str], timeout: float, *options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, *tests],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)


def _run_one(mutant: Mutant, module_file: str, tests: list[str], timeout: float, workdir: Path) -> Outcome:
    base, copy = _mutated_checkout(workdir, module_file, mutant.source)
    start = time.perf_counter()
    try:
        proc = _pytest(copy, tests, timeout, "-x")
        killed, timed_out = proc.returncode != 0, False
        if proc.returncode == 5:
            raise RuntimeError(f"no tests ran for {tests}")
    except subprocess.TimeoutExpired:
        killed, timed_out = True, True
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return Outcome(mutant.line, mutant.what, killed, timed_out, round(time.perf_counter() - start, 1))


def _check_copy_is_used(module_file: str, tests: list[str], workdir: Path) -> None:
    """The tests must import the copy, not the checkout: a module that raises on import must fail them."""
    broken = Mutant(0, "import fails", "raise ImportError('mutation harness probe')\n")
    if not _run_one(broken, module_file, tests, 600, workdir).killed:
        raise RuntimeError("the tests did not import the mutated copy (is scratchlm installed non-editable "
                           "somewhere that comes first on sys.path?)")


def run_hand_mutations(workdir: Path, only: list[str] | None = None) -> bool:
    """Apply each of HAND_MUTATIONS alone (with `only`: those whose name holds one of its words,
    ignoring case); print the tests that fail it. True when every one fails some."""
    chosen = [m for m in HAND_MUTATIONS if not only or any(w.lower() in m[0].lower() for w in only)]
    if not chosen:
        raise RuntimeError(f"no hand mutation's name holds any of {only}")
    _check_copy_is_used("generation/sampling.py", MODULES["sampling"][1], workdir)
    all_killed, killed = True, 0
    for name, module_file, old, new, tests in chosen:
        source = (REPO / _repo_path(module_file)).read_text(encoding="utf-8")
        if source.count(old) != 1:
            raise RuntimeError(f"{name}: the text to change is not in {_repo_path(module_file)} exactly once")
        base, copy = _mutated_checkout(workdir, module_file, source.replace(old, new))
        try:
            proc = _pytest(copy, tests, 900, "-rf")
        finally:
            shutil.rmtree(base, ignore_errors=True)
        failed = sorted({line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED ")})
        all_killed &= bool(failed)
        killed += bool(failed)
        print(f"{'killed' if failed else 'SURVIVED'}: {name} ({module_file}){': ' + ', '.join(failed) if failed else ''}",
              flush=True)
    print(f"hand mutations: {killed}/{len(chosen)} killed", flush=True)
    return all_killed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", nargs="?", choices=sorted(MODULES))
    parser.add_argument("--hand", action="store_true", help="apply the hand-made mutations of HAND_MUTATIONS instead")
    parser.add_argument("--only", nargs="+", metavar="WORD", default=None,
                        help="with --hand: only the mutations whose name holds one of these words (any case)")
    parser.add_argument("--max", type=int, default=None, help="mutants to run, drawn at random (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw (default: 0)")
    parser.add_argument("--jobs", type=int, default=2, help="pytest processes at once (default: 2)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before a mutant counts as hanging")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--json", type=Path, default=None, help="also write the outcomes to this file")
    parser.add_argument("--survivors", type=Path, default=None, metavar="EARLIER.json",
                        help="rerun only the survivors of an earlier --json run of this module (after new tests: "
                             "a killed mutant stays killed when tests are only added), and give the score over "
                             "that run's mutants")
    args = parser.parse_args()
    if args.hand:
        with tempfile.TemporaryDirectory(prefix="scratchlm-mutate-") as tmp:
            return 0 if run_hand_mutations(Path(tmp), args.only) else 1
    if args.module is None or args.only:
        parser.error("--only goes with --hand" if args.only else "give a module (or --hand)")
    module_file, tests = MODULES[args.module]
    found = mutants(REPO / "scratchlm" / module_file)
    chosen = found if args.max is None or args.max >= len(found) else sorted(
        random.Random(args.seed).sample(found, args.max), key=lambda m: (m.line, m.what))
    earlier = None
    if args.survivors is not None:
        earlier = json.loads(args.survivors.read_text())
        wanted = {(o["line"], o["what"]) for o in earlier["outcomes"] if not o["killed"]}
        chosen = [m for m in found if (m.line, m.what) in wanted]  # the source must not have moved since
    if args.list:
        for m in chosen:
            print(f"{module_file}:{m.line}: {m.what}")
        return 0
    print(f"{module_file}: {len(found)} mutants, running {len(chosen)} against {' '.join(tests)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="scratchlm-mutate-") as tmp:
        _check_copy_is_used(module_file, tests, Path(tmp))
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            outcomes = list(pool.map(lambda m: _run_one(m, module_file, tests, args.timeout, Path(tmp)), chosen))
    survivors = [o for o in outcomes if not o.killed]
    killed = len(outcomes) - len(survivors)
    for o in survivors:
        print(f"SURVIVED {module_file}:{o.line}: {o.what}")
    hung = sum(o.timed_out for o in outcomes)
    print(f"{args.module}: {killed}/{len(outcomes)} killed (score {killed / max(1, len(outcomes)):.0%}"
          f"{f', {hung} by timeout' if hung else ''}) in {time.perf_counter() - start:.0f} s")
    if earlier is not None:
        # every earlier survivor was rerun (with any mutant sharing its line and edit), and the
        # mutants not rerun were killed before: so each survivor now is one mutant still alive
        total, before = earlier["run"], earlier["killed"]
        now = total - len(survivors)
        print(f"{args.module}: over the earlier run's {total} mutants, {before} killed before, {now} now "
              f"(score {before / total:.0%} -> {now / total:.0%})")
    if args.json:
        args.json.write_text(json.dumps({"module": args.module, "mutants": len(found), "run": len(outcomes),
                                         "killed": killed, "outcomes": [asdict(o) for o in outcomes]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
