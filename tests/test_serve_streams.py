"""`scratchlm serve`'s generation streams over real HTTP on loopback (scratchlm/serve/streams.py,
labels.py): each stream against `scratchlm generate`'s output and the model's plain forward pass
(no cache, no decoding copy), streams side by side, readers that go away, and a bounded load.

A uvicorn server runs in this process (a thread), so the tests can count the server's threads.
The rest of the playground's tests: test_serve_api.py, test_serve_library.py, test_serve_cli.py,
test_serve_hardening.py, test_serve_host_names.py, test_serve_browser.py.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from helpers import JSON, Served, active_streams, cli_generate, parse_sse, request, wait_until


def generate_events(port: int, body: dict) -> list[tuple[str, dict]]:
    status, text = request(port, "POST", "/api/generate", body)
    assert status == 200, text
    return parse_sse(text)


def streamed_text(events: list[tuple[str, dict]]) -> str:
    tokens = "".join(d["text"] for e, d in events if e == "token")
    (done,) = [d for e, d in events if e == "done"]
    assert done["text"].startswith(tokens)  # a tail held back to the end (a stop-string prefix) is done's only
    return done["text"]


# ------------------------------------------------------------------------------ generation


@pytest.mark.parametrize("prompt", ["ROMEO:", "床前明", ""])
def test_the_greedy_stream_equals_scratchlm_generate(served, runs, prompt):
    events = generate_events(served.port, {"run": "mixed", "prompt": prompt, "greedy": True, "max_new_tokens": 60})
    assert [e for e, _ in events][0] == "start" and events[-1][0] == "done"
    assert streamed_text(events) == cli_generate(runs / "mixed", prompt, "--greedy", "--max-new-tokens", "60")
    indices = [d["index"] for e, d in events if e == "token"]
    assert indices == list(range(len(indices))) and events[-1][1]["tokens"] == len(indices)
    done = events[-1][1]  # timed on the server's clock: to the first token, and to the end
    assert 0 < done["first_token_seconds"] <= done["seconds"]


def test_sampled_streams_equal_the_command_line_with_the_same_seed(served, runs):
    options = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.1, "seed": 123}
    events = generate_events(served.port, {"run": "mixed", "prompt": "The ", "max_new_tokens": 50, **options})
    from scratchlm.checkpoint import load_model

    _, tokenizer, _ = load_model(runs / "mixed")
    assert events[0] == ("start", {"prompt_ids": 4, "start_ids": tokenizer.encode("The "), "cropped": False,
                                   "seed": 123})
    expected = cli_generate(runs / "mixed", "The ", "--max-new-tokens", "50", "--temperature", "0.9", "--top-k", "20",
                            "--top-p", "0.95", "--repetition-penalty", "1.1", "--seed", "123")
    assert streamed_text(events) == expected


def test_each_tokens_probabilities_are_the_models_softmax(served, runs):
    """p and the top 5 of every token event against the model's plain forward pass over the
    prompt and the tokens so far (float64, no cache, no decoding copy), with a sampled stream so
    that the chosen token is often not the top one."""
    from scratchlm.checkpoint import load_model

    events = generate_events(served.port, {"run": "mixed", "prompt": "ROMEO:", "max_new_tokens": 25, "seed": 7,
                                           "temperature": 1.5})
    model, tokenizer, _ = load_model(runs / "mixed")
    model = model.double()
    ids = tokenizer.encode("ROMEO:")
    not_top = 0
    for event, data in events:
        if event != "token":
            continue
        window = torch.tensor([ids[-model.config.block_size:]])
        with torch.no_grad():
            logits = model(window)[0][0, -1]  # (V,)
        probs = torch.softmax(logits[: tokenizer.vocab_size], -1)
        assert data["p"] == pytest.approx(float(probs[data["id"]]), abs=1e-6)
        order = torch.argsort(probs, descending=True)[:5].tolist()
        assert [t["id"] for t in data["top"]] == order
        assert [t["p"] for t in data["top"]] == pytest.approx(probs[order].tolist(), abs=1e-6)
        not_top += data["id"] != order[0]
        ids.append(data["id"])
    assert not_top > 0  # the comparison covered tokens sampled below the top


class _Chars:
    """A tokenizer whose pieces are awkward for hand-written JSON: a quote, a backslash, a newline,
    a non-ASCII letter, a closing script tag; and plain letters after them."""

    pieces = ['"', "\\", "\n", "é", "a", "</script>", "b", "c", "d", "e"]

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_a_token_events_json_text_parses_to_the_softmax_with_ties_by_lower_id():
    """token_sse writes its JSON by hand: json.loads must read it back, the probabilities must be
    NumPy's float64 softmax, and equal scores inside the top 5 list the lower id first."""
    from scratchlm.serve.labels import Labels
    from scratchlm.serve.streams import token_sse

    logits = torch.tensor([0.5, 2.0, 2.0, -1.0, 2.0, 0.0])  # ids 1, 2, 4 tie at the top
    text = token_sse(Labels(_Chars()), 3, 4, 'x"\\y\n', logits)
    assert text.startswith("event: token\ndata: ") and text.endswith("\n\n") and text.count("\n") == 3
    data = json.loads(text[len("event: token\ndata: "):])
    z = np.array([0.5, 2.0, 2.0, -1.0, 2.0, 0.0])
    probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert (data["index"], data["id"], data["text"]) == (3, 4, 'x"\\y\n')
    assert data["label"] == "a" and data["p"] == pytest.approx(probs[4], abs=1e-12)
    assert [t["id"] for t in data["top"]] == [1, 2, 4, 0, 5]
    assert [t["label"] for t in data["top"]] == ["\\", "\u21b5", "a", '"', "</script>"]  # ↵: a newline shown
    assert [t["p"] for t in data["top"]] == pytest.approx(probs[[1, 2, 4, 0, 5]].tolist(), abs=1e-12)


@pytest.mark.parametrize("scores, expected", [
    ([0.0] * 10, [0, 1, 2, 3, 4]),  # all equal: the five lowest ids, whatever topk picks
    ([1.0, 3, 3, 3, 3, 3, 3, 0, -1, -2], [1, 2, 3, 4, 5]),  # six tie for the first place
    ([3.0, 1, 2, 2, 2, 2, 2, 2, 0, 5], [9, 0, 2, 3, 4]),  # seven tie across the fifth place
])
def test_ties_across_the_fifth_place_go_to_the_lower_ids(scores, expected):
    from scratchlm.serve.labels import Labels
    from scratchlm.serve.streams import token_sse

    text = token_sse(Labels(_Chars()), 0, 0, "", torch.tensor(scores))
    assert [t["id"] for t in json.loads(text.split("data: ", 1)[1])["top"]] == expected


@pytest.mark.parametrize("bad", ["all -inf", "a nan", "a +inf"])
def test_a_token_event_of_scores_with_no_probabilities_is_still_json(bad):
    from scratchlm.serve.labels import Labels
    from scratchlm.serve.streams import token_sse

    scores = torch.full((10,), float("-inf")) if bad == "all -inf" else torch.arange(10.0)
    if bad != "all -inf":
        scores[3] = float(bad.split()[1])
    text = token_sse(Labels(_Chars()), 0, 0, "", scores)
    data = json.loads(text.split("data: ", 1)[1])  # the browser's JSON.parse takes no NaN
    assert data["p"] is None and len(data["top"]) == 5 and all(t["p"] is None for t in data["top"])


def test_a_prompt_the_tokenizer_cannot_encode_is_a_bad_request(served):
    """As on the attention tab: one JSON error line with status 400, before any stream starts."""
    got, answer = request(served.port, "POST", "/api/generate", {"run": "mixed", "prompt": "Ωmega", "max_new_tokens": 5})
    assert got == 400 and "'Ω'" in answer["error"]
    assert active_streams(served) == 0


def test_eight_streams_at_once_each_get_what_they_get_alone(served):
    bodies = [{"run": "mixed", "prompt": ["The ", "床", "ROMEO:", "月光"][i % 4], "max_new_tokens": 80, "seed": i,
               "temperature": 1.0, "top_k": 30} for i in range(8)]
    alone = [streamed_text(generate_events(served.port, b)) for b in bodies]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda b: streamed_text(generate_events(served.port, b)), bodies))
    assert together == alone
    assert len(set(alone)) == 8  # the seeds gave eight different texts: the comparison can tell them apart


def test_a_reader_that_goes_away_stops_its_generation(runs):
    """The client closes the connection after three tokens of a 100,000-token request: the model
    thread drops the stream, long before the tokens asked for."""
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    with Served(RunLibrary(runs=runs), Limits(max_new_tokens=100_000)) as s:
        for seed in range(20):  # a draw may reach the end-of-text token by itself: then the next seed
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            conn.request("POST", "/api/generate", body=json.dumps({"run": "mixed", "prompt": "The ", "seed": seed,
                                                                   "max_new_tokens": 100_000}), headers=JSON)
            resp = conn.getresponse()
            seen, line = 0, None
            while seen < 3 and line not in ("", "event: done\n"):  # a draw may reach end-of-text first
                line = resp.fp.readline().decode()
                seen += line.startswith("event: token")
            if active_streams(s) == 1:
                break
            conn.close()
        assert active_streams(s) == 1
        began = time.monotonic()
        resp.close()
        conn.close()
        assert wait_until(lambda: active_streams(s) == 0, 20), "the generation went on after the reader left"
        print(f"\nthe stream ended {time.monotonic() - began:.2f} s after the reader closed")


def test_a_reader_that_leaves_a_beam_search_stops_it(runs, monkeypatch):
    """Beam search answers in one event at its end; a reader that goes away before then stops it
    at its next step, and the model thread is free for others at once (not after 100,000 steps)."""
    from scratchlm.generation.engine import Engine
    from scratchlm.serve.app import Limits
    from scratchlm.serve.library import RunLibrary

    answers = []  # what should_stop said, step by step, in the search the server ran
    search = Engine.beam_search

    def watched(*args, should_stop, **kwargs):
        return search(*args, should_stop=lambda: answers.append(should_stop()) or answers[-1], **kwargs)

    monkeypatch.setattr(Engine, "beam_search", watched)
    with Served(RunLibrary(runs=runs), Limits(max_new_tokens=100_000)) as s:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/api/generate", body=json.dumps({"run": "mixed", "prompt": "The ", "beams": 4,
                                                               "max_new_tokens": 100_000}), headers=JSON)
        assert wait_until(lambda: active_streams(s) == 1, 20)
        time.sleep(0.3)  # well into the search
        conn.close()
        assert wait_until(lambda: active_streams(s) == 0, 20), "the beam search went on after the reader left"
        assert request(s.port, "GET", "/api/model?run=mixed", timeout=20)[0] == 200
    assert len(answers) > 1 and answers[-1] is True and not any(answers[:-1])


def test_beam_search_asks_should_stop_before_each_step():
    from scratchlm.generation.generate import Stopped, beam_search

    asked = []
    stop_at_third = lambda: asked.append(1) or len(asked) == 3  # noqa: E731
    with pytest.raises(Stopped):
        beam_search(_tiny_model(), torch.tensor([1, 2, 3]), beams=3, max_new_tokens=50, should_stop=stop_at_third)
    assert len(asked) == 3
    assert len(beam_search(_tiny_model(), torch.tensor([1, 2, 3]), beams=3, max_new_tokens=5, num_samples=3,
                           should_stop=lambda: False)) == 3


def _tiny_model():
    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=8)).eval()


def test_beams_answer_with_the_command_lines_best_sequence(served, runs):
    events = generate_events(served.port, {"run": "mixed", "prompt": "The ", "max_new_tokens": 20, "beams": 3})
    assert [e for e, _ in events] == ["done"]
    header, text = cli_generate(runs / "mixed", "The ", "--max-new-tokens", "20", "--beams", "3").split("\n", 1)
    assert text == events[0][1]["text"]
    assert float(re.search(r"logprob (-?[\d.]+)", header).group(1)) == pytest.approx(events[0][1]["logprob"], abs=1e-4)


# ------------------------------------------------------------------------------ load


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_a_bounded_load_leaks_no_threads_or_memory(served):
    """8 streams at once, then 100 short requests, three rounds: no error, the generation threads
    all end, and the memory after the last round is within a few MiB of after the first."""
    port = served.port
    shorts = [("GET", "/api/runs", None), ("GET", "/api/model?run=mixed", None),
              ("POST", "/api/attention", {"run": "mixed", "text": "The king"}),
              ("POST", "/api/generate", {"run": "mixed", "prompt": "a", "max_new_tokens": 3, "seed": 1})]
    rss, threads = [], []
    for _ in range(3):
        with ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(lambda i: streamed_text(generate_events(
                port, {"run": "mixed", "prompt": "The ", "max_new_tokens": 120, "seed": i})), range(8)))
        assert all(texts)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: request(port, *shorts[i % 4]), range(100)))
        assert all(status == 200 for status, _ in answers)
        assert wait_until(lambda: active_streams(served) == 0)
        rss.append(_rss_mib())
        threads.append(sorted(t.name for t in threading.enumerate()))
    print(f"\nmemory after each round: {', '.join(f'{r:.1f}' for r in rss)} MiB; threads after each round: "
          f"{[len(t) for t in threads]}")
    assert rss[-1] - rss[0] < 8, rss
    # no thread of the server's own is left over; the web server's pool (anyio, for file reads)
    # keeps idle workers for a few seconds, up to its limit of 40, and is not counted as a leak
    pooled = "AnyIO worker thread"
    assert [[n for n in names if n != pooled] for names in threads] == [[n for n in threads[0] if n != pooled]] * 3
    assert all(names.count(pooled) <= 40 for names in threads)
