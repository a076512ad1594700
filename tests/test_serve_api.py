"""The playground's requests over real HTTP on loopback (scratchlm/serve/app.py): bad requests and
bounds, the page and its static files, and the data of the other tabs, each checked against
something the server did not compute (the NumPy reference's attention, `scratchlm inspect
--json`, a metrics file written by the test)."""

from __future__ import annotations

import http.client
import json
import re

import numpy as np
import pytest

from helpers import JSON, cli_output, request


# ------------------------------------------------------------------------------ bad input and bounds


@pytest.mark.parametrize("body, status, words", [
    ({"run": "mixed", "prompt": "x" * 4001}, 400, "4,000 characters"),
    ({"run": "mixed", "max_new_tokens": 1001}, 400, "1 to 1000"),
    ({"run": "mixed", "max_new_tokens": 0}, 400, "1 to 1000"),
    ({"run": "mixed", "max_new_tokens": "9"}, 400, "expected int"),
    ({"run": "mixed", "temperature": -1}, 400, "temperature"),
    ({"run": "mixed", "top_p": 1.5}, 400, "top_p"),
    ({"run": "mixed", "greedy": "yes"}, 400, "greedy"),
    ({"run": "mixed", "beams": 99}, 400, "beams"),
    ({"run": "mixed", "seed": -1}, 400, "seed: must be a whole number from 0 to 2**63 - 1"),
    ({"run": "mixed", "seed": 2**63}, 400, "seed: must be a whole number from 0 to 2**63 - 1"),
    ({"run": "mixed", "stop": ["e"]}, 400, "unknown field stop"),
    ({"run": "mixed", "num_samples": 2, "best_of": 3}, 400, "unknown fields best_of, num_samples"),
    ({"run": "mixed", "beams": 2, "length_penalty": float("nan")}, 400, "length_penalty: must be a finite number"),
    ({"run": "mixed", "beams": 2, "length_penalty": float("inf")}, 400, "length_penalty: must be a finite number"),
    ({"run": "nope"}, 404, "no run named"),
    ({"run": None}, 404, "no run named in the request"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_generate_requests_get_one_error_line(served, body, status, words):
    got, answer = request(served.port, "POST", "/api/generate", body)
    assert got == status and words in answer["error"] and "\n" not in answer["error"]


def test_bodies_are_capped_and_must_be_json(served):
    got, answer = request(served.port, "POST", "/api/generate", raw=b'{"prompt": "' + b"a" * 70_000 + b'"}')
    assert got == 413 and "65,536 bytes" in answer["error"]
    got, answer = request(served.port, "POST", "/api/attention", raw=b"\xff\xfe not json")
    assert got == 400 and "not JSON" in answer["error"]
    # a chunked body (no Content-Length) is counted as it arrives
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.request("POST", "/api/generate", body=iter([b"[" + b"1," * 20_000] * 3), encode_chunked=True,
                 headers=JSON)
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()


@pytest.mark.parametrize("since", ["%C2%B2", "%D9%A3", "-1", "1.5", "x"])  # ², Arabic-Indic 3: digits to str.isdigit
def test_a_training_offset_that_is_not_ascii_digits_is_a_bad_request(served, since):
    got, answer = request(served.port, "GET", f"/api/training?run=mixed&since={since}")
    assert got == 400 and answer["error"].startswith("since: a byte offset")


@pytest.mark.parametrize("path", ["/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py",
                                  "/static/%2e%2e%2f%2e%2e%2fcli.py", "/static//etc/passwd", "/../pyproject.toml"])
def test_static_files_never_leave_the_static_folder(served, path):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.putrequest("GET", path, skip_accept_encoding=True)  # sent as is, not normalised
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read().decode("utf-8", "replace")
    assert resp.status == 404 and "import" not in body and "root:" not in body


def test_the_page_and_its_files_come_from_the_package(served):
    got, page = request(served.port, "GET", "/")
    assert got == 200 and "<html" in page.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing from the internet
    for asset in re.findall(r"""(?:src|href)=["'](/static/[^"']+)["']""", page):
        got, text = request(served.port, "GET", asset)
        text = text.replace("http://www.w3.org/2000/svg", "")  # SVG's namespace: a name, never fetched
        assert got == 200 and "http://" not in text and "https://" not in text, asset


def _record_defaults() -> dict:
    """Each generation setting's default, read from the two records themselves (the front ends
    start max_new_tokens at 200, where a library call's record says 100)."""
    import dataclasses

    from scratchlm.generation.sampling import SamplingOptions
    from scratchlm.generation.settings import GenerationSettings

    own = {f.name: f.default for f in dataclasses.fields(GenerationSettings) if f.name != "sampling"}
    return {**own, **{f.name: f.default for f in dataclasses.fields(SamplingOptions)}, "max_new_tokens": 200}


def test_the_pages_settings_are_the_records_fields_and_its_inputs_start_at_their_defaults(served):
    """/static/generation.js carries every field of GenerationSettings and SamplingOptions but the
    two a request refuses (stop strings, several samples), each with the record's default; the
    page has one input per field and no other, showing that default (empty: off)."""
    got, script = request(served.port, "GET", "/static/generation.js")
    assert got == 200
    sent = json.loads(re.search(r"const GENERATION = (\{.*\});", script).group(1))
    defaults = {k: v for k, v in _record_defaults().items() if k not in ("stop", "num_samples")}
    assert {f["name"]: f["default"] for f in sent["fields"]} == defaults
    assert sent["inert"]["greedy"]["names"] == ["temperature", "top_k", "top_p", "min_p", "seed"]
    assert set(sent["inert"]["beams"]["names"]) == {"temperature", "top_k", "top_p", "min_p", "seed",
                                                    "repetition_penalty", "greedy"}
    _, page = request(served.port, "GET", "/")
    settings = page[page.index('<details id="settings"'):page.index("</details>", page.index('<details id="settings"'))]
    inputs = {m.group(1): m.group(0) for m in re.finditer(r'<input id="(\w+)"[^>]*>', settings)}
    assert set(inputs) == set(defaults)
    for name, default in defaults.items():
        tag = inputs[name]
        if isinstance(default, bool):
            assert ("checked" in tag) == default, tag
        elif default is None:
            assert 'placeholder="' in tag and "value=" not in tag, tag
        else:
            assert float(re.search(r'value="([^"]+)"', tag).group(1)) == default, tag


# ------------------------------------------------------------------------------ the other pages' data


def test_attention_weights_equal_the_numpy_reference(served, runs):
    """Every layer and head, against the NumPy twin's forward pass in float64."""
    from scratchlm.checkpoint import load_model
    from scratchlm.reference.numpy_gpt import forward_trace, params_from_state_dict

    text = "月光 and the king"
    got, data = request(served.port, "POST", "/api/attention", {"run": "mixed", "text": text})
    assert got == 200, data
    model, tokenizer, _ = load_model(runs / "mixed")
    ids = tokenizer.encode(text)
    assert data["ids"] == ids and len(data["labels"]) == len(ids) and data["labels"][0] == "月"
    trace = forward_trace(np.array(ids), params_from_state_dict({k: v.double() for k, v in model.state_dict().items()}),
                          model.config)
    weights = np.array(data["weights"])  # (L, H, T, T)
    assert weights.shape == (2, 2, len(ids), len(ids))
    for layer in range(2):
        np.testing.assert_allclose(weights[layer], trace[f"h{layer}.weights"], atol=1e-5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, 1) == 0)


def test_attention_text_is_bounded(served):
    got, answer = request(served.port, "POST", "/api/attention", {"run": "mixed", "text": "a" * 33})
    assert got == 400 and "at most 32" in answer["error"]
    got, answer = request(served.port, "POST", "/api/attention", {"run": "mixed", "text": ""})
    assert got == 400 and "empty" in answer["error"]


def test_inside_is_what_scratchlm_inspect_reports(served, runs):
    got, data = request(served.port, "GET", "/api/inside?run=mixed")
    assert got == 200
    report = json.loads(cli_output("inspect", "--checkpoint", str(runs / "mixed"), "--json"))
    assert data["trace"] == report["trace"]["stations"] and data["total"] == report["parameters"]["total"]
    assert data["total"] == sum(int(np.prod(p["shape"])) for p in data["params"])
    assert [p["name"] for p in data["params"]][:2] == ["transformer.wte.weight", "transformer.h.0.ln_1.weight"]


def test_the_walkthrough_is_the_hand_models_forward_pass(served):
    got, data = request(served.port, "GET", "/api/walkthrough")
    assert got == 200 and data["labels"] == list("床前明月山") and data["max_diff"] < 1e-12
    probs = np.array(next(s["torch"] for s in data["steps"] if s["key"] == "probs"))
    logits = np.array(next(s["torch"] for s in data["steps"] if s["key"] == "logits"))
    np.testing.assert_allclose(probs, np.exp(logits) / np.exp(logits).sum(-1, keepdims=True), atol=1e-12)


def test_training_records_follow_a_growing_metrics_file(tmp_path, runs):
    """Records from an offset, a half-written last line left for the next poll, `training` true
    only while a process holds the run's lock, and a file that shrank read from the start."""
    import shutil

    from scratchlm.runlock import RunLock
    from scratchlm.serve.app import Limits, training_data

    run = tmp_path / "live"
    shutil.copytree(runs / "mixed", run)
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"event": "train", "step": 1, "loss": 4.0}\n{"event": "eval", "st', encoding="utf-8")
    first = training_data(run, metrics, 0, Limits())
    assert [r["step"] for r in first["records"]] == [1] and first["next"] == len(metrics.read_bytes().split(b"\n")[0]) + 1
    assert first["training"] is False
    with open(metrics, "a", encoding="utf-8") as f:
        f.write('ep": 2, "val_loss": 3.5}\n{"event": "sample", "step": 2, "text": "床前"}\n')
    with RunLock(run):
        second = training_data(run, metrics, first["next"], Limits())
    assert [r["event"] for r in second["records"]] == ["eval", "sample"] and second["records"][1]["text"] == "床前"
    assert second["training"] is True and second["next"] == metrics.stat().st_size
    metrics.write_text('{"event": "start", "step": 0}\n', encoding="utf-8")
    again = training_data(run, metrics, second["next"], Limits())
    assert again["reset"] and [r["event"] for r in again["records"]] == ["start"]
