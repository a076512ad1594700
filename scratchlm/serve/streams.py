"""Generation as a stream of events for the playground, and the one thread that runs the model.

All of the server's torch work (loading a model, every generation step, attention, inspect) runs
on one thread, the ModelThread. On a CPU, torch and scratchlm's kernels compute each step with a
team of threads (OpenMP), and several threads each leading their own team make every team wait
for cores the others hold: measured here, a stream stepped from a second thread beside another
ran at half the speed `scratchlm generate` reaches, and at full speed from one thread alone. So
requests do not each get a thread: the model thread takes turns, one step of each running
stream per round, and answers other work between rounds. The web server's event loop only
sends what the steps made, so sending never waits for the model and the model never waits for
the network: a slow reader lets its events queue (MAX_QUEUED, then its stream pauses), and a
reader that goes away cancels its stream, which the model thread drops before its next step.

Events (each `event: NAME` and `data: JSON`):
  start  {"prompt_ids", "start_ids", "cropped", "seed"}   (beam search sends done alone, at its end)
         start_ids: the ids the model starts from (the prompt's, its last block_size when cropped);
         a chat reply's start also has "dropped": its oldest exchanges left out to fit the context
  token  {"index", "id", "label", "text", "p", "q", "forced", "top": [{"id", "label", "p", "q"}, ...]}
         p and top are the model's own softmax of the step's raw scores (before temperature or
         any filter), so they say how sure the model was, whatever the sampling settings; top is
         the likeliest first, equal ones by lower id. p is null where the scores held a NaN or
         an infinity (no probability exists then). q is the probability the token had in the
         draw: after the repetition penalty, temperature, top-k, top-p and min-p (0: filtered
         out; greedy: 1 for the token taken, 0 for the rest). forced: the request gave this token
         (a continuation from a token the reader chose) rather than the draw choosing it.
  done   {"reason", "tokens", "seconds", "first_token_seconds", "text", "logprob"}
         reason: length | eos | stop | stopped (the server is shutting down: a reader that stops
         a stream goes away and reads no more). seconds: on the server's clock, from taking the
         request to the end (queued events and the reader's pace included, as the reader lives
         it); first_token_seconds: to the first token (null: none, or beams).
  error  {"message"}
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch

from scratchlm.generation.sampling import SamplingOptions, sampling_probs
from scratchlm.serve.labels import Labels
from scratchlm.serve.library import Loaded

TOP_ALTERNATIVES = 5
SEND_EVERY = 0.05
"""Seconds a batch of events gathers before it is sent: 20 sends a second at most, each one arrival
for the page to handle (a write per token cost the browser more than the model spent on it)."""
MAX_QUEUED = 4096
"""Events a stream may hold for a reader that is slower than the model; past this the stream
waits for the reader (no event is ever dropped)."""


@dataclass
class GenerateRequest:
    prompt: str
    max_new_tokens: int
    seed: int
    beams: int = 1
    length_penalty: float = 1.0
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_k, top_p, min_p, ...
    forced: list[int] = field(default_factory=list)  # ids the first steps take (see Engine.stream_tokens)
    prompt_ids: list[int] | None = None  # a chat template's prompt (chat_api.for_chat), instead of `prompt`
    end_id: int | None = None  # the token a reply ends at (<|end|>), instead of the tokenizer's end of text
    dropped: int = 0  # exchanges of a conversation left out of prompt_ids to fit the context

    @property
    def settings(self):
        """The request as one generation's settings (a GenerationSettings): max_new_tokens new
        tokens after the forced ones."""
        from scratchlm.generation.settings import GenerationSettings

        return GenerationSettings.of(max_new_tokens=self.max_new_tokens + len(self.forced), seed=self.seed,
                                     beams=self.beams, length_penalty=self.length_penalty, **self.sampling)


def token_sse(labels: Labels, index: int, token: int, text: str, logits: torch.Tensor,
              drawn: torch.Tensor | None = None, forced: bool = False) -> str:
    """The token event as SSE text, for logits (V,) the step's raw scores and drawn (V,) the
    distribution the draw used (sampling_probs; None: the raw scores' own). Written as JSON text
    around the labels' cached literals, with torch's softmax and top-k: dicts, json.dumps and a
    dozen NumPy calls cost about twice as much, and at a small model every token pays it on the
    model's thread (measurements.md)."""
    probs = torch.softmax(logits.detach().double(), -1)  # the model's own distribution, of the raw scores
    drawn = probs if drawn is None else drawn
    top = _likeliest(probs, TOP_ALTERNATIVES)
    alternatives = ",".join(f'{{"id":{i},"label":{labels[i]},"p":{_number(p)},"q":{_number(float(drawn[i]))}}}'
                            for p, i in top)
    return (f'event: token\ndata: {{"index":{index},"id":{token},"label":{labels[token]},'
            f'"text":{json.dumps(text, ensure_ascii=False)},"p":{_number(float(probs[token]))},'
            f'"q":{_number(float(drawn[token]))},"forced":{"true" if forced else "false"},'
            f'"top":[{alternatives}]}}\n\n')


def _likeliest(probs: torch.Tensor, k: int) -> list[tuple[float, int]]:
    """The k likeliest of probs (V,) as (p, id), likeliest first and equal ones by lower id.
    topk picks among ties at the k-th place as it likes, so when the (k+1)-th equals the k-th,
    every id as likely as the k-th is a candidate, ranked by a stable sort in id order."""
    top_p, top_ids = probs.topk(min(k + 1, probs.numel()))
    ps, ids = top_p.tolist(), top_ids.tolist()
    if len(ps) > k and not ps[k - 1] > ps[k]:  # a tie across the k-th place, or NaN
        candidates = torch.nonzero(probs >= ps[k - 1]).squeeze(1)  # ascending ids; none when NaN
        if candidates.numel() >= k:
            values = probs[candidates]
            order = torch.sort(values, descending=True, stable=True).indices[:k]
            return list(zip(values[order].tolist(), candidates[order].tolist()))
    return sorted(zip(ps[:k], ids[:k]), key=lambda pi: (-pi[0], pi[1]))


def _number(x: float) -> str:
    """x as JSON: repr's shortest round-trip digits; null for NaN, which every probability is
    when a score was NaN or +inf, or all were -inf (JSON has no NaN)."""
    return repr(x) if math.isfinite(x) else "null"


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class GenerationStream:
    """One request's generation: stepped by the ModelThread (`advance`), read on the event loop
    (`events`)."""

    def __init__(self, loaded: Loaded, request: GenerateRequest, loop: asyncio.AbstractEventLoop):
        self.loaded = loaded
        self.request = request
        self.loop = loop
        self.made: list[str | None] = []  # events made and not yet sent; None ends the stream
        self.made_lock = threading.Lock()
        self.ready = asyncio.Event()  # set (on the loop) when `made` stops being empty
        self.cancel = threading.Event()
        self.server_stopping = lambda: False  # the ModelThread's flag, once it takes the stream
        self.queued = 0  # len(made): the model thread skips this stream past MAX_QUEUED
        self.steps = None
        self.text: list[str] = []
        self.index, self.reason = 0, "length"
        self.ids: list[int] = []  # the model's sequence: the ids it started from, then each token
        self.options = None  # the SamplingOptions, when they change the model's distribution
        self.began: float | None = None  # perf_counter() when generation began; None before
        self.first_token: float | None = None  # seconds from began to the first token

    def _stop_asked(self) -> bool:
        """The reader went away, or the server is stopping."""
        return self.cancel.is_set() or self.server_stopping()

    def _put(self, text: str | None) -> None:
        with self.made_lock:
            wake = not self.made  # one wake-up of the event loop per batch, not per event
            self.made.append(text)
            self.queued = len(self.made)
        if wake:
            self.loop.call_soon_threadsafe(self.ready.set)

    def advance(self) -> bool:
        """One step of work, on the model thread: the first call starts (or, with beams, runs)
        the generation, each later one makes one token. False once the stream has ended."""
        try:
            if self._stop_asked():
                self._finish("stopped")
                return False
            if self.queued >= MAX_QUEUED:
                return True  # the reader is behind: let it catch up before stepping again
            if self.steps is None:
                return self._begin()
            step = next(self.steps, None)
            if step is None:
                self._finish(self.reason)
                return False
            self.text.append(step.text)
            self.reason = step.reason or self.reason
            if step.id is not None:
                if self.first_token is None:
                    self.first_token = time.perf_counter() - self.began
                forced = self.index < len(self.request.forced)
                self._put(token_sse(self.loaded.labels, self.index, step.id, step.text, step.logits,
                                    self._drawn(step.logits), forced))
                self.ids.append(step.id)
                self.index += 1
            return True
        except Exception as exc:  # noqa: BLE001 - reported to the page as one line, not a dead stream
            self._close_steps()
            self._put(sse("error", {"message": str(exc) or type(exc).__name__}))
            self._put(None)
            return False

    def _begin(self) -> bool:
        from scratchlm.generation.beam import Stopped

        from scratchlm.generation.engine import Engine

        r, engine = self.request, self.loaded.engine
        if r.end_id is not None:  # a chat reply: the same model, ending at the template's end token
            engine = Engine(engine.model, engine.tokenizer, dtype=engine.dtype, eos_id=r.end_id)
        self.began = time.perf_counter()
        if r.beams > 1:  # one call, which a reader that goes away (or the server stopping) cuts short
            try:
                result = engine.generate(r.prompt, r.settings, should_stop=self._stop_asked)
            except Stopped:
                self._finish("stopped")
                return False
            self._put(sse("done", {"reason": result.finish_reasons[0], "tokens": len(result.ids),
                                   "seconds": time.perf_counter() - self.began, "first_token_seconds": None,
                                   "text": result.text,
                                   "logprob": result.logprobs[0]}))
            self._put(None)
            return False
        self.steps = engine.stream_tokens(r.prompt if r.prompt_ids is None else r.prompt_ids, r.settings,
                                          forced=r.forced)
        self.ids = list(self.steps.start_ids)
        options = r.settings.sampling  # the very options the draw uses
        self.options = None if options == SamplingOptions() else options  # defaults: the raw scores' softmax
        start = {"prompt_ids": len(self.steps.prompt_ids), "start_ids": self.ids, "cropped": self.steps.cropped,
                 "seed": r.seed}
        self._put(sse("start", start if r.end_id is None else {**start, "dropped": r.dropped}))
        return True

    def _drawn(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The distribution this step's draw used (None: the model's own, no setting changed it)."""
        if self.options is None:
            return None
        previous = torch.tensor([self.ids], device=logits.device) if self.options.repetition_penalty != 1 else None
        return sampling_probs(logits.detach()[None], previous, self.options)[0]

    def _close_steps(self) -> None:
        if self.steps is not None:
            self.steps.close()  # puts the model back in its former mode
            self.steps = None

    def _finish(self, reason: str) -> None:
        self._close_steps()
        seconds = 0.0 if self.began is None else time.perf_counter() - self.began  # stopped before it began: none
        self._put(sse("done", {"reason": reason, "tokens": self.index, "seconds": seconds,
                               "first_token_seconds": self.first_token, "text": "".join(self.text),
                               "logprob": None}))
        self._put(None)

    async def events(self) -> AsyncIterator[str]:
        """The SSE text, in batches: after the first event of a batch, whatever else the model
        makes in the next SEND_EVERY seconds goes out with it (fewer, larger writes: the reader
        handles each arrival once). Ends with the stream, or when the reader goes away (then the
        stream is cancelled)."""
        try:
            while True:
                await self.ready.wait()
                with self.made_lock:
                    finished = None in self.made
                if not finished:
                    await asyncio.sleep(SEND_EVERY)
                with self.made_lock:
                    batch, self.made = self.made, []
                    self.queued = 0
                    self.ready.clear()
                chunk = "".join(b for b in batch if b is not None)
                if chunk:
                    yield chunk
                if None in batch:
                    return
        finally:
            self.cancel.set()


class ModelThread:
    """The one thread that runs torch for the server (see the module's docstring). `call` runs a
    function there and gives a future of its result; `add` hands it a stream to step."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.active: list[GenerationStream] = []
        self.stopping = False  # set by stop_streams: every stream, running, queued or new, ends
        self.thread = threading.Thread(target=self._run, name="scratchlm-model", daemon=True)
        self.thread.start()

    def call(self, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((fn, args, future))
        return future

    def add(self, stream: GenerationStream) -> None:
        self.jobs.put((None, (stream,), None))

    def stop_streams(self) -> None:
        """End every stream at its next step, each with its done event (reason "stopped"): those
        running (a beam search too), those waiting, and any added later. Safe from any thread, and
        from a signal handler: a plain assignment, no lock (the handler may have interrupted a
        thread holding one)."""
        self.stopping = True

    def close(self) -> None:
        self.stop_streams()
        self.jobs.put(None)
        self.thread.join(10)

    def _run(self) -> None:
        idle = False  # the last round stepped no stream (every reader behind): wait a little
        while True:
            try:
                job = self.jobs.get(block=not self.active or idle, timeout=0.005 if self.active else None)
            except queue.Empty:
                job = False  # nothing waiting: a round of steps
            if job is None:
                for stream in self.active:
                    stream.cancel.set()
                    stream.advance()
                return
            if job:  # every waiting job before the next round
                self._take(job)
                continue
            before = [(stream.index, stream.queued) for stream in self.active]
            self.active = [stream for stream in self.active if stream.advance()]
            idle = bool(self.active) and before == [(stream.index, stream.queued) for stream in self.active]

    def _take(self, job) -> None:
        fn, args, future = job
        if fn is None:
            args[0].server_stopping = lambda: self.stopping
            self.active.append(args[0])
        elif future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                future.set_exception(exc)
