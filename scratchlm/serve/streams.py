"""Generation as a stream of events for the playground.

A worker thread runs the model a step at a time (holding the model's lock for each forward
pass, so concurrent streams take turns) and hands each step's event to the web server's event
loop, which sends whatever has piled up as Server-Sent Events. Sending never waits for the
model, and the model never waits for the network: a slow reader only lets events queue, and
MAX_QUEUED bounds that. A reader that goes away sets `cancel`; the worker sees it before its next
step and ends, so a closed tab stops its generation.

Events (each `event: NAME` and `data: JSON`):
  start  {"prompt_ids", "cropped", "seed"}
  token  {"index", "id", "label", "text", "p", "top": [{"id", "label", "p"}, ...]}
         p and top are the model's own softmax of the step's raw scores (before temperature or
         any filter), so they say how sure the model was, whatever the sampling settings.
  done   {"reason", "tokens", "seconds", "text", "logprob"}   reason: length | eos | stop | stopped
  error  {"message"}
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch

from scratchlm.serve.library import Loaded

TOP_ALTERNATIVES = 5
MAX_QUEUED = 4096
"""Events a stream may hold for a reader that is slower than the model; past this the worker
waits (it never drops an event)."""


@dataclass
class GenerateRequest:
    prompt: str
    max_new_tokens: int
    seed: int
    beams: int = 1
    length_penalty: float = 1.0
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_k, top_p, min_p, ...


def shown(label: str) -> str:
    """A label with every control character drawn as its Unicode picture (\x03 as ␃, DEL as ␡),
    so no token is invisible on the page."""
    return "".join(chr(0x2400 + ord(c)) if ord(c) < 0x20 else "\u2421" if c == "\x7f" else c for c in label)


def id_label(tokenizer: Any, token: int) -> str:
    """A token shown alone: its text with whitespace and control characters visible; a byte-level
    piece of a character (no whole character of its own) as its id."""
    from scratchlm.tokenize_view import visible

    text = tokenizer.decode([token])
    if "\ufffd" in text:
        return f"[byte piece #{token}]"
    return shown(visible(text)) or f"[#{token}]"


def token_event(tokenizer: Any, index: int, token: int, text: str, logits: torch.Tensor) -> dict[str, Any]:
    probs = torch.softmax(logits.double(), dim=-1)  # (V,) the model's own distribution
    p_top, i_top = probs.topk(min(TOP_ALTERNATIVES, probs.numel()))
    return {
        "index": index, "id": token, "label": id_label(tokenizer, token), "text": text,
        "p": float(probs[token]),
        "top": [{"id": int(i), "label": id_label(tokenizer, int(i)), "p": float(p)}
                for p, i in zip(p_top.tolist(), i_top.tolist())],
    }


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class GenerationStream:
    """One request's generation: `run` in a worker thread, `events` on the event loop."""

    def __init__(self, loaded: Loaded, request: GenerateRequest, loop: asyncio.AbstractEventLoop):
        self.loaded = loaded
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.cancel = threading.Event()
        self.room = threading.Semaphore(MAX_QUEUED)
        self.thread = threading.Thread(target=self._run, name="scratchlm-generate", daemon=True)

    def start(self) -> "GenerationStream":
        self.thread.start()
        return self

    def _put(self, text: str | None) -> None:
        while not self.room.acquire(timeout=0.5):
            if self.cancel.is_set():
                return
        self.loop.call_soon_threadsafe(self.queue.put_nowait, text)

    def _run(self) -> None:
        try:
            if self.request.beams > 1:
                self._beams()
            else:
                self._tokens()
        except Exception as exc:  # noqa: BLE001 - reported to the page as one line, not a dead stream
            self._put(sse("error", {"message": str(exc) or type(exc).__name__}))
        finally:
            self._put(None)

    def _tokens(self) -> None:
        from scratchlm.generate import _encode_prompt, stream_tokens

        r, lock = self.request, self.loaded.lock
        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        with lock:
            ids, _, cropped = _encode_prompt(model, tokenizer, r.prompt)
            steps = stream_tokens(model, tokenizer, r.prompt, max_new_tokens=r.max_new_tokens, seed=r.seed,
                                  **r.sampling)
        self._put(sse("start", {"prompt_ids": len(ids), "cropped": cropped, "seed": r.seed}))
        text, index, reason, began = [], 0, "length", time.perf_counter()
        try:
            while not self.cancel.is_set():
                with lock:
                    step = next(steps, None)
                    if step is not None and step.logits is not None:
                        event = token_event(tokenizer, index, step.id, step.text, step.logits)
                if step is None:
                    break
                text.append(step.text)
                reason = step.reason or reason
                if step.id is not None:
                    self._put(sse("token", event))
                    index += 1
            else:
                reason = "stopped"
        finally:
            with lock:
                steps.close()  # puts the model back in its mode, under the lock like every step
        self._put(sse("done", {"reason": reason, "tokens": index, "seconds": time.perf_counter() - began,
                               "text": "".join(text), "logprob": None}))

    def _beams(self) -> None:
        from scratchlm.generate import generate

        r = self.request
        began = time.perf_counter()
        with self.loaded.lock:
            result = generate(self.loaded.model, self.loaded.tokenizer, r.prompt, max_new_tokens=r.max_new_tokens,
                              beams=r.beams, length_penalty=r.length_penalty)
        self._put(sse("done", {"reason": result.finish_reasons[0], "tokens": len(result.ids),
                               "seconds": time.perf_counter() - began, "text": result.text,
                               "logprob": result.logprobs[0]}))

    async def events(self) -> AsyncIterator[str]:
        """The SSE text, a batch of whatever events are ready per send. Ends with the stream, or
        when the reader goes away (then the worker is told to stop)."""
        try:
            while True:
                first = await self.queue.get()
                batch = [first]
                while first is not None and not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                done = None in batch
                chunk = "".join(b for b in batch if b is not None)
                for _ in range(len(batch) - done):
                    self.room.release()
                if chunk:
                    yield chunk
                if done:
                    return
        finally:
            self.cancel.set()
