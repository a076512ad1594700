"""scripts/check_docs.py fails when a quoted number no longer is what its command prints (issue 33).

The page under test quotes what the command printed when this test ran it (a plain subprocess,
not check_docs); then one number is changed by hand and the checker must name that line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import check_docs  # noqa: E402 - after the path line above

PROBE_THIS_MACHINE = check_docs.this_machine  # the real probe, before a fixture stands in for it

COMMAND = 'scratchlm walkthrough --tokens 床,前,明,月,山 --ids 床,前,明 | grep -A3 "  loss = mean"'


@pytest.fixture(scope="module")
def printed() -> list[str]:
    script = f'scratchlm() {{ "{sys.executable}" -m scratchlm "$@"; }}\n{COMMAND}'
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True).stdout
    lines = out.splitlines()
    assert any("loss = mean" in line for line in lines), out
    return lines


@pytest.fixture(scope="module")
def here() -> "check_docs.Machine":
    return check_docs.this_machine(check_docs._env())


@pytest.fixture(autouse=True)
def docs_written_here(here, monkeypatch):
    """The tests' pages are written on this machine (strict comparison) unless a test says otherwise."""
    monkeypatch.setattr(check_docs, "this_machine", lambda env: here)
    monkeypatch.setattr(check_docs, "docs_machine", lambda: here)


def _page(tmp_path: Path, quoted: list[str], prose: str = "") -> Path:
    page = tmp_path / "page.md"
    page.write_text("\n".join(["# A page", "", "```bash", COMMAND, "```", "", "```", *quoted, "```", "", prose, ""]),
                    encoding="utf-8")
    return page


def _changed(line: str) -> str:
    """The line with the last digit of its first decimal number moved by one."""
    number = check_docs.DECIMAL.search(line).group(0)
    last = str((int(number[-1]) + 1) % 10)
    return line.replace(number, number[:-1] + last, 1)


def test_a_page_quoting_what_is_printed_passes_and_one_changed_number_fails(tmp_path, printed, capsys):
    values = next(line for line in printed if check_docs.DECIMAL.search(line) and "[" in line)
    assert check_docs.main([str(_page(tmp_path, printed))]) == 0
    at = printed.index(values)
    wrong = [*printed[:at], _changed(values), *printed[at + 1 :]]
    capsys.readouterr()
    assert check_docs.main([str(_page(tmp_path, wrong))]) == 1
    report = capsys.readouterr().out
    assert f"page.md:{8 + at}:" in report and _changed(values).strip() in report and values.strip() in report


def test_an_excerpt_checks_the_numbers_it_keeps(tmp_path, printed):
    heading = printed[0]  # "  loss = mean of the per-position cross-entropy  ()   max |torch - numpy| = ..."
    values = printed[1]
    cut = values[: values.index(check_docs.DECIMAL.search(values).group(0)) + 6] + " ..."
    assert check_docs.main([str(_page(tmp_path, ["...", cut]))]) == 0
    assert check_docs.main([str(_page(tmp_path, ["...", _changed(cut)]))]) == 1
    assert check_docs.main([str(_page(tmp_path, [heading.replace("loss", "lost")]))]) == 1  # not printed at all


def test_numbers_in_prose_must_be_printed_ones_at_the_precision_written(tmp_path, printed):
    loss = check_docs.DECIMAL.search(printed[1]).group(0)  # e.g. 1.7904
    rounded = f"{float(loss):.2f}"
    prose = f"<!-- check_docs: numbers -->\nThe loss is {loss}, about {rounded}."
    assert check_docs.main([str(_page(tmp_path, printed, prose))]) == 0
    wrong = f"<!-- check_docs: numbers -->\nThe loss is {float(loss) + 0.01:.4f}."
    assert check_docs.main([str(_page(tmp_path, printed, wrong))]) == 1


def test_what_differs_between_machines_is_compared_by_shape():
    assert check_docs._same("x  max |torch - numpy| = 4.4e-16", "x  max |torch - numpy| = 2.2e-16") is True
    assert check_docs._same("step 1/200: loss 4.1070, lr 3.00e-02, ...",
                            "step 1/200: loss 4.1070, lr 3.00e-02, 5,120 tokens/s, ETA 3s") is True
    assert check_docs._same("step 1/200: loss 4.1183, lr 3.00e-02, ...",
                            "step 1/200: loss 4.1070, lr 3.00e-02, 5,120 tokens/s") is False
    assert check_docs._same("step 1/200: val loss ...", "step 1/200: loss 4.1070") is None


def test_a_block_inside_a_list_item_is_read_without_its_indent_and_rewritten_with_it(tmp_path, printed):
    values = printed[1]
    lines = ["# A page", "", "- An item:", "", f"  <!-- check_docs: output of {COMMAND} -->", "  ```text",
             "  ...", "  " + _changed(values), "  ```", ""]
    page = tmp_path / "page.md"
    page.write_text("\n".join(lines), encoding="utf-8")
    assert check_docs.main([str(page)]) == 1
    assert check_docs.main([str(page), "--write"]) == 0
    assert page.read_text(encoding="utf-8").splitlines()[7] == "  " + values.rstrip()
    assert check_docs.main([str(page)]) == 0


def test_on_a_machine_that_adds_differently_numbers_need_only_be_close(tmp_path, printed, here, monkeypatch, capsys):
    other = check_docs.Machine("0" * 16, "a machine with other vector units")
    monkeypatch.setattr(check_docs, "docs_machine", lambda: other)
    at, values = next((i, line) for i, line in enumerate(printed) if check_docs.DECIMAL.search(line) and "[" in line)
    close, far = _changed(values), _scaled(values, 1.5)
    text = "THESEUS: he ar are are an he"  # generated text that another machine's training would not repeat
    page = _page(tmp_path, [*printed[:at], close, *printed[at + 1 :], text])
    capsys.readouterr()
    assert check_docs.main([str(page)]) == 0
    report = capsys.readouterr().out
    assert "adds differently" in report and "within 5%" in report and "1 quoted line(s) without numbers not compared" in report
    assert check_docs.main([str(_page(tmp_path, [*printed[:at], far, *printed[at + 1 :]]))]) == 1
    assert check_docs.main([str(page), "--write"]) == 2  # a rewrite here would mix two machines' numbers
    monkeypatch.setattr(check_docs, "docs_machine", lambda: here)
    assert check_docs.main([str(page)]) == 1  # on the docs' own machine the changed digit fails


def test_close_means_within_the_tolerance_of_the_larger():
    assert check_docs._same("loss 2.9286, ...", "loss 2.9485, x", 0.05) is True
    assert check_docs._same("loss 2.9286, ...", "loss 2.9485, x") is False
    assert check_docs._same("loss 2.9286, ...", "loss 3.3145, x", 0.05) is False
    assert check_docs._stands_for("2.66", "2.6118", 0.05) and not check_docs._stands_for("2.66", "2.6118")
    assert not check_docs._stands_for("2.66", "3.18", 0.05)


def test_the_fingerprint_is_the_same_twice_and_moves_with_the_vector_kernels(here):
    env = check_docs._env()
    assert _real_probe(env) == here.fingerprint
    if "avx2" in here.description.split(", ")[1].split():
        assert _real_probe({**env, "ATEN_CPU_CAPABILITY": "default"}) != here.fingerprint  # torch's scalar kernels


def _real_probe(env: dict[str, str]) -> str:
    return PROBE_THIS_MACHINE(env).fingerprint


def _scaled(line: str, factor: float) -> str:
    """The line with its first decimal number multiplied by factor, at the same precision."""
    number = check_docs.DECIMAL.search(line).group(0)
    decimals = len(number.split(".")[1]) if "." in number else 0
    return line.replace(number, f"{float(number.replace(',', '')) * factor:.{decimals}f}", 1)
