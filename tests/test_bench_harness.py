"""The benchmark harness's bookkeeping on a made-up results dict: tables, files, the results page.
Nothing is timed here (benchmarks are never run as tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root holds `benchmarks`

from benchmarks import harness  # noqa: E402


def _fake_results(finished: str = "2026-01-02T10:00:00") -> dict:
    decode = {
        "threads": 2,
        "shapes": {"gpt2-124m": {
            "decoders": {"ours bf16": {"best_tok_s": 61.25, "median_tok_s": 55.5},
                         "hf fp32": {"best_tok_s": 26.0, "median_tok_s": 25.0}},
            "bandwidth": {"read_gb_s": 20.0, "copy_gb_s": 15.0},
            "limits": {"bf16": {"bytes_per_token": 250e6, "limit_tok_s": 80.0, "fraction": 55.5 / 80.0}},
        }},
        "targets": [{"target": "decode ours bf16 / hf fp32", "ratio": 2.22, "goal": 2.0, "met": True},
                    {"target": "decode bf16 share of bandwidth limit", "ratio": 0.69375, "goal": 0.7, "met": False}],
    }
    prepare = {"command": "scratchlm prepare --data shakespeare", "min_s": 1.5, "median_s": 1.75,
               "median_mb_per_s": 2.74, "targets": [{"target": "prepare, s", "ratio": 1.75, "goal": 10.0, "met": True,
                                                      "lower_is_better": True}]}
    return {
        "date": "2026-01-02", "finished": finished, "command": "python -m benchmarks --only decode prepare",
        "machine": {"host": "box", "cpu": "Some CPU", "cores": 2, "torch": "9.9", "transformers": "1.0", "threads": 2,
                    "default_dtype": "float32", "cuda": None, "load_average": [0.5, 0.25, 0.125], "commit": "abc1234"},
        "benchmarks": {
            "prepare": {"result": prepare, "load_average_start": [0.5, 0, 0]},
            "decode": {"result": decode, "load_average_start": [1.5, 0, 0]},
            "train": {"error": "ImportError: nope", "load_average_start": [2.0, 0, 0]},
        },
    }


def test_markdown_table_holds_every_figure_and_target():
    md = harness.markdown(_fake_results())
    lines = md.splitlines()
    assert "Some CPU, 2 cores, torch 9.9" in lines[0] and "load average 0.5, 0.2, 0.1 when" in lines[0]
    assert "| decode gpt2-124m, 2 thr | ours bf16 | 61.2 | 55.5 | tok/s |" in lines
    assert "| decode gpt2-124m, 2 thr | hf fp32 | 26.0 | 25.0 | tok/s |" in lines
    assert "| prepare | `scratchlm prepare --data shakespeare`, end to end | 1.50 | 1.75 | s |" in lines
    # the limit row: 20 GB/s / 250 MB = 80 tok/s, ours at 55.5 / 80 = 69%
    assert any(line.startswith("| decode gpt2-124m, 2 thr | bf16 limit: 20.0 GB/s read / 250 MB per token (ours at 69%)")
               and "| 80.0 | tok/s |" in line for line in lines)
    assert "| train | failed: ImportError: nope |  |  |  |" in lines
    assert "| decode ours bf16 / hf fp32 | 2.22 | >= 2.0 | met |" in lines
    assert "| decode bf16 share of bandwidth limit | 0.69 | >= 0.7 | **not met** |" in lines
    assert "| prepare, s | 1.75 | <= 10.0 | met |" in lines
    assert "prepare 0.5, decode 1.5, train 2.0" in md


def test_results_page_section_is_replaced_between_markers_only(tmp_path: Path):
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    source = tmp_path / "benchmarks" / "results" / "x.json"
    page.write_text(f"# Results\n\nintro\n\n{harness.START}\nold figures\n{harness.END}\n\n## After\n\ntext\n")
    harness.update_page("| new | table |\n", page, source=source)
    text = page.read_text()
    assert "old figures" not in text
    assert text.startswith("# Results\n\nintro\n\n" + harness.START + "\n")
    assert text.endswith("| new | table |\n" + harness.END + "\n\n## After\n\ntext\n")
    assert "[x.json](../benchmarks/results/x.json)" in text  # the link is relative to the page's folder
    harness.update_page("| new | table |\n", page, source=source)  # idempotent
    assert page.read_text() == text


def test_page_without_markers_gets_them_at_its_end_and_a_missing_page_a_title(tmp_path: Path):
    page = tmp_path / "results.md"
    page.write_text("# Results\n\nhow they are measured\n")
    harness.update_page("figures\n", page)
    assert page.read_text() == f"# Results\n\nhow they are measured\n\n{harness.START}\nfigures\n{harness.END}\n"
    fresh = tmp_path / "new" / "results.md"
    harness.update_page("figures\n", fresh)
    text = fresh.read_text()
    assert text.startswith("# Benchmark results\n") and text.endswith(f"{harness.START}\nfigures\n{harness.END}\n")


def test_newest_full_results_file_feeds_the_page(tmp_path: Path):
    folder = tmp_path / "results"
    folder.mkdir()
    older, newer = _fake_results("2026-01-01T09:00:00"), _fake_results("2026-01-03T09:00:00")
    newer["machine"]["host"] = "newer-box"
    quick = _fake_results("2026-01-04T09:00:00")
    quick["machine"]["host"] = "quick-box"
    (folder / "2026-01-01-box.json").write_text(json.dumps(older))
    (folder / "2026-01-03-newer-box.json").write_text(json.dumps(newer))
    (folder / "2026-01-04-box-quick.json").write_text(json.dumps(quick))
    assert harness.newest_results(folder).name == "2026-01-03-newer-box.json"
    assert harness.newest_results(folder, include_quick=True).name == "2026-01-04-box-quick.json"
    page = tmp_path / "results.md"
    page.write_text("# t\n")
    assert harness.regenerate_page(folder, page).name == "2026-01-03-newer-box.json"
    assert "`newer-box`" in page.read_text() and "quick-box" not in page.read_text()
    assert "(results/2026-01-03-newer-box.json)" in page.read_text()
    assert harness.results_path("2026-01-02", "h", quick=True, folder=folder).name == "2026-01-02-h-quick.json"


@pytest.mark.parametrize("flag", ["--page-only", "--readme-only"])
def test_page_only_needs_no_results_to_fail_cleanly(tmp_path: Path, monkeypatch, flag):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    monkeypatch.setattr(harness, "PAGE", tmp_path / "results.md")
    assert harness.main([flag]) == 1
    assert not (tmp_path / "results.md").exists()


def test_the_figures_live_on_the_results_page_that_the_readme_links_to():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert harness.PAGE == root / "docs" / "results.md"
    assert harness.START not in readme and "](docs/results.md)" in readme
    page = harness.PAGE.read_text(encoding="utf-8")
    assert page.index(harness.START) < page.index("| benchmark | what | best | median | unit |") < page.index(harness.END)


def test_rows_for_time_to_loss_and_train():
    peer = {"runs": [{"reached_s": None, "reached_step": None, "final_val_loss": 1.8857}], "reached": False,
            "min_s": 90.0, "median_s": 90.0, "median_tokens_per_s": 17000.0}
    ours = {"runs": [{"val_loss": 1.8791, "reached_step": 450}, {"val_loss": 1.8779, "reached_step": 450}],
            "reached": True, "min_s": 27.04, "median_s": 27.96, "median_tokens_per_s": 14000.0}
    entry = {"result": {"threads": 1, "peer": peer, "presets": {"shakespeare-char-fast": ours}}}
    assert harness.rows_for("time_to_loss", entry) == [
        ("time to val loss 1.88, 1 thr", "classic recipe, HF GPT-2 (peer): at steps -, val 1.886 (not reached)",
         "90.0", "90.0", "s"),
        ("time to val loss 1.88, 1 thr", "classic recipe, HF GPT-2 (peer) tokens/s", "", "17,000", "tok/s"),
        ("time to val loss 1.88, 1 thr", "`shakespeare-char-fast`: at steps 450, 450, val 1.879, 1.878", "27.0", "28.0", "s"),
        ("time to val loss 1.88, 1 thr", "`shakespeare-char-fast` tokens/s", "", "14,000", "tok/s"),
    ]
    assert harness.rows_for("time_to_loss-nobf16", entry)[0][0] == "time to val loss 1.88, 1 thr, no bf16"
    train = {"result": {"shape": {"B": 8, "T": 256, "V": 50304},
                        "speed": {"ours fp32": {"best_tok_s": 12345.4, "median_tok_s": 12000.0}},
                        "memory": {"hf": {"growth_mb": 812.4}},
                        "mfu": {"ours bf16": {"mfu": 0.4567, "mfu_median": 0.44, "peak_gflops": 430.0}}}}
    assert harness.rows_for("train", train) == [
        ("train step B 8 T 256 V 50304", "ours fp32", "12,345", "12,000", "tok/s"),
        ("train peak memory", "hf", "", "812", "MB"),
        ("train share of measured matmul peak", "ours bf16 (of 430 GFLOP/s measured)", "45.7", "44.0", "%"),
    ]


@pytest.mark.parametrize("name", ["prepare", "prepare-stream", "decode-1t", "decode", "train", "time_to_loss"])
def test_every_benchmark_has_a_runner(name):
    assert name in harness.RUNNERS


def test_prepare_stream_rows_and_targets():
    from benchmarks.bench_prepare_stream import targets

    f = {"input_mb": 1000.2, "min_s": 100.0, "median_s": 110.0, "best_mb_per_s": 10.0, "median_mb_per_s": 9.09,
         "peak_rss_mb": 412.3, "ratio": 0.95, "tiktoken": {"best_mb_per_s": 10.5, "median_mb_per_s": 9.57}}
    files = {"txt": f, "jsonl": {**f, "peak_rss_mb": 1100.0, "ratio": 0.5}}
    r = {"workers": 2, "files": files, "targets": targets(files)}
    rows = harness.rows_for("prepare-stream", {"result": r})
    assert rows[0] == ("prepare 1,000 MB .txt, gpt2, 2 thr", "`scratchlm prepare`, end to end", "100.00", "110.00", "s")
    assert rows[2][1] == "tiktoken encode_ordinary_batch (peer), encoding only (prepare at 0.95x)"
    assert rows[3] == ("prepare 1,000 MB .txt, gpt2, 2 thr", "`scratchlm prepare` peak memory (RSS)", "", "412", "MB")
    assert len(rows) == 8
    assert [t["met"] for t in r["targets"]] == [True, True, False, False]
    md = harness.markdown({**_fake_results(), "benchmarks": {"prepare-stream": {"result": r, "load_average_start": [1, 0, 0]}}})
    assert "| prepare-stream .txt peak memory, MB | 412.30 | <= 1024.0 | met |" in md
    assert "| prepare-stream .jsonl MB/s / tiktoken encode_ordinary_batch MB/s | 0.50 | >= 0.9 | **not met** |" in md
    skipped = harness.rows_for("prepare-stream", {"result": {"skipped": "no GPT-2 rank file", "targets": []}})
    assert skipped == [("prepare-stream", "skipped: no GPT-2 rank file", "", "", "")]


def test_prepare_stream_corpus_is_seeded_and_the_same_documents_in_both_files(tmp_path: Path, monkeypatch):
    from benchmarks import bench_prepare_stream
    from benchmarks.bench_prepare_stream import write_corpus

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first, second = write_corpus(a, 0.2, seed=1), write_corpus(b, 0.2, seed=1)
    for kind in ("txt", "jsonl"):
        assert first["paths"][kind].read_bytes() == second["paths"][kind].read_bytes()
    docs = [json.loads(line)["text"] for line in first["paths"]["jsonl"].read_text(encoding="utf-8").splitlines()]
    assert len(docs) == first["documents"] > 1
    assert "\n\n".join(docs) + "\n\n" == first["paths"]["txt"].read_text(encoding="utf-8")
    assert abs(first["txt_mb"] - 0.2) < 0.05 and any("\u3002" in d for d in docs)  # some Chinese lines
    monkeypatch.setattr(bench_prepare_stream, "PEER_PIECE_CHARS", 5000)  # the peer's pieces: the text, cut at line ends
    pieces = list(bench_prepare_stream._txt_pieces(first["paths"]["txt"]))
    assert len(pieces) > 10 and "".join(pieces) == first["paths"]["txt"].read_text(encoding="utf-8")
    assert all(p[-2:-1].strip() and p.endswith("\n") and pieces[i + 1][0].strip() for i, p in enumerate(pieces[:-1]))


def test_time_to_loss_target_is_the_fastest_preset_that_reached_the_loss_against_the_peer():
    from benchmarks.bench_time_to_loss import target_rows

    peer = {"median_s": 100.0, "median_tokens_per_s": 10000.0}
    presets = {"slow": {"median_s": 58.0, "max_s": 60.0, "reached": True},
               "fast": {"median_s": 30.0, "max_s": 32.0, "reached": True},
               "fastest but short": {"median_s": 20.0, "max_s": 21.0, "reached": False}}
    (row,) = target_rows(presets, peer)
    assert "(fast)" in row["target"] and row["ratio"] == pytest.approx(0.32) and row["met"]  # its slowest run counts
    (row,) = target_rows({"fast": {"median_s": 30.0, "max_s": 34.0, "reached": True}}, peer)
    assert not row["met"]  # one run at 0.34x of the peer's time
    (row,) = target_rows({"b": {"median_s": 20.0, "max_s": 20.0, "reached": False}}, peer)
    assert not row["met"]  # fast enough, but the loss was never reached
    assert target_rows({}, peer) == [] and target_rows(presets, None) == []


def test_time_to_loss_compares_the_fp32_step_with_the_peer_in_the_same_run():
    from benchmarks.bench_time_to_loss import target_rows

    classic = {"median_s": 60.0, "max_s": 61.0, "reached": True, "median_tokens_per_s": 13000.0}
    peer = {"median_s": 100.0, "median_tokens_per_s": 10000.0}
    _, step = target_rows({"shakespeare-char": classic}, peer, {"ours_tokens_per_s": 13000.0, "peer_tokens_per_s": 10000.0})
    assert step["ratio"] == pytest.approx(1.3) and step["met"]
    _, step = target_rows({"shakespeare-char": classic}, peer, {"ours_tokens_per_s": 13000.0, "peer_tokens_per_s": 11000.0})
    assert step["ratio"] == pytest.approx(13 / 11) and not step["met"]
    assert len(target_rows({"shakespeare-char": classic}, peer)) == 1  # no step measured: no step row


def test_decode_limits_pair_each_run_with_its_own_bandwidth():
    from benchmarks.bench_decode import limits

    # 250 MB per token; runs at 80, 100 and 90 tok/s beside 25, 40 and 30 GB/s: limits 100, 160
    # and 120 tok/s, shares 0.8, 0.625, 0.75 -> median 0.75. Strict: 90 / (50 GB/s / 250 MB) = 0.45.
    paired = [{"tok_s": 80.0, "read_gb_s": 25.0}, {"tok_s": 100.0, "read_gb_s": 40.0}, {"tok_s": 90.0, "read_gb_s": 30.0}]
    lim = limits(250_000_000, 90.0, paired, 50.0)
    assert lim["fraction"] == pytest.approx(0.75)
    assert lim["limit_tok_s"] == pytest.approx(120.0)
    assert lim["strict_limit_tok_s"] == pytest.approx(200.0) and lim["strict_fraction"] == pytest.approx(0.45)
    rows = harness.rows_for("decode", {"result": {"threads": 2, "shapes": {"gpt2-124m": {
        "decoders": {}, "bandwidth": {"read_gb_s": 50.0}, "limits": {"bf16": lim}}}}})
    assert rows == [
        ("decode gpt2-124m, 2 thr", "bf16 limit beside each run: 25.0-40.0 GB/s read / 250 MB per token "
                                    "(ours at 75%, median of runs)", "", "120.0", "tok/s"),
        ("decode gpt2-124m, 2 thr", "bf16 strict limit: 50.0 GB/s, the run's best read / 250 MB per token "
                                    "(ours at 45%)", "", "200.0", "tok/s")]
    assert limits(250_000_000, 90.0, [], 50.0)["fraction"] == pytest.approx(0.45)  # no probes: the strict share


def test_a_merged_file_says_which_run_made_which_figures():
    results = _fake_results()
    assert "Command: `python -m benchmarks --only decode prepare`." in harness.markdown(results)  # no record kept
    results["produced_by"] = {"decode": {"command": "python -m benchmarks --only decode", "commit": "aaa1111"},
                              "prepare": {"command": "python -m benchmarks", "commit": "bbb2222"}}
    first = harness.markdown(results).splitlines()[0]
    assert "decode by `python -m benchmarks --only decode` at commit aaa1111" in first
    assert "prepare by `python -m benchmarks` at commit bbb2222" in first
    assert "train by an earlier run, not recorded" in first
    results["produced_by"] = {n: {"command": "python -m benchmarks", "commit": "ccc"} for n in results["benchmarks"]}
    assert "Command: `python -m benchmarks`." in harness.markdown(results)
