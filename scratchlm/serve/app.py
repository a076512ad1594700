"""The playground's web app: a page, its scripts, and a small JSON + event-stream API.

Built on Starlette (the ASGI toolkit FastAPI itself is made of) and served by uvicorn. Starlette
is enough here: eleven routes, a static folder and a streaming response; FastAPI's request models
and generated OpenAPI pages would add a dependency (pydantic) and nothing the page uses.

    GET  /                  the page (static/index.html)
    GET  /static/FILE       its script and style, shipped in the package (nothing from the internet)
    GET  /static/generation.js   the generation settings' fields, defaults and inert rules, made from
                            the records (GenerationSettings, SamplingOptions), not a file
    GET  /api/runs          the model picker: the runs that may be shown, and the default (the newest
                            with a checkpoint)
    GET  /api/model?run=R   one run's config and the server's limits
    POST /api/generate      {"run", "prompt", sampling options..., "forced"} -> Server-Sent Events (see streams)
    POST /api/chat          {"run", "messages", sampling options...} -> the reply's events (chat_api)
    POST /api/chat/template {"run", "messages", "train_on"} -> the conversation as a training row (chat_api)
    POST /api/attention     {"run", "text"} or {"run", "ids"} -> every layer's and head's attention weights
    GET  /api/inside?run=R  the shape trace and parameter table (what `scratchlm inspect` shows)
    GET  /api/walkthrough   the hand-size model's forward pass, station by station
    POST /api/walkthrough   {"run", "text"} -> that run's forward pass on the text, station by station
                            (at most its first 32 tokens: scratchlm.inside.walkthrough_run)
    GET  /api/training?run=R&since=OFFSET   the run's metrics records written since OFFSET, and lines skipped

Every request's work is bounded (see Limits): the body (its size and its JSON's depth), the
prompt, the tokens asked for, the attention text or ids, the number of streams at once, the numbers in a
query, and the time and connections a client may hold (guard.py, which also answers only this
server's own Host names and, on the API, only its own page). All torch work runs on one thread
(streams.ModelThread: why, there); the event loop and a small pool only read files and send.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from scratchlm.errors import UserError
from scratchlm.generation.options import SamplingOptions
from scratchlm.generation.settings import BEAM_ONLY, generation_fields, inert_settings
from scratchlm.records import setting_fields
from scratchlm.serve.chat_api import chat_messages, for_chat, template_view
from scratchlm.serve.guard import Guard, Listener, connection_cap, guarded_protocol, quiet_accept_errors
from scratchlm.serve.library import Loaded, RunLibrary, UnknownRun
from scratchlm.serve.streams import GenerateRequest, GenerationStream, ModelThread

STATIC = Path(__file__).parent / "static"
HAND_TOKENS = ("床", "前", "明", "月", "山")  # names for the hand preset's 5 ids, as in the docs


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int = 1000
    prompt_chars: int = 4000
    body_bytes: int = 64 * 1024
    attention_tokens: int = 128
    forced_tokens: int = 4000  # ids a continuation from a chosen token may keep (each is a model step)
    walk_params: int = 30_000_000  # the largest model the Inside tab walks (a float64 copy, every station twice)
    streams: int = 16  # generations running at once; more are told to retry
    metrics_bytes: int = 2 * 1024 * 1024  # metrics sent per poll at most; a longer line is skipped
    json_depth: int = 8  # arrays and objects inside each other in a body (the API's are flat)
    connections: int = 256  # open at once; past this, the one waiting longest for its request goes
    request_seconds: float = 10.0  # to send a whole request, head and body, from connecting (or the last answer)
    idle_seconds: int = 5  # an open connection with no request after its last answer is closed
    head_bytes: int = 16 * 1024  # a request's line and headers


def server_config(app, limits: Limits, listener: socket.socket):
    """uvicorn's settings for the playground: the h11 protocol with guard.py's deadline and cap,
    uvicorn's keep-alive timeout and concurrency limit, and h11's header size limit; and the
    ceiling of `listener` (a guard.Listener, as cli._bind makes) at twice the cap."""
    import uvicorn

    cap = connection_cap(limits.connections)
    if isinstance(listener, Listener):
        listener.ceiling = 2 * cap
    # loop="asyncio": uvloop (if installed) accepts in C and would never ask the Listener
    return uvicorn.Config(app, loop="asyncio", log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                          http=guarded_protocol(limits.request_seconds, cap), ws="none",  # no page uses one
                          timeout_keep_alive=limits.idle_seconds, limit_concurrency=cap + limits.streams,
                          h11_max_incomplete_event_size=limits.head_bytes)


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _guarded(handler):
    """A route that answers bad input with one JSON error line and the right status, never a trace."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except BadRequest as exc:
            return _error(str(exc), exc.status)
        except UnknownRun as exc:
            return _error(str(exc), 404)
        except UserError as exc:
            return _error(str(exc), 400)
        except ClientDisconnect:  # the client left mid-request (or took too long: guard.py)
            return Response(status_code=400)  # nobody is there to read it

    return route


async def _json_body(request: Request, limits: Limits) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and (not (declared.isascii() and declared.isdigit()) or int(declared) > limits.body_bytes):
        raise BadRequest(f"the request body is larger than {limits.body_bytes:,} bytes", 413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.body_bytes:
            raise BadRequest(f"the request body is larger than {limits.body_bytes:,} bytes", 413)
    try:
        data = json.loads(body)
        too_deep = _depth(data) > limits.json_depth
    except RecursionError:  # Python's reader recurses: about 1,000 deep fits in the body limit
        too_deep = True
    except (ValueError, UnicodeDecodeError) as exc:
        why = "a number in it has more than 4,300 digits" if "digits" in str(exc) else "it is not JSON"
        raise BadRequest(f"the request body cannot be read: {why}") from None
    if too_deep:
        raise BadRequest(f"the request body nests arrays or objects more than {limits.json_depth} deep")
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in a parsed JSON value (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, (list, dict)):
            deepest = max(deepest, depth)
            todo += [(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)]
    return deepest


def _field(data: dict[str, Any], name: str, kind: type, default: Any = None, *, optional: bool = False) -> Any:
    value = data.get(name, default)
    if value is None and optional:
        return None
    if isinstance(value, int) and abs(value) >= 2**64:  # no option takes one; float() would overflow
        raise BadRequest(f"{name}: a number too large ({len(str(abs(value)))} digits)")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadRequest(f"{name}: expected {kind.__name__}, got {json.dumps(value)[:40]}")
    return value


def _text(data: dict[str, Any], name: str, limits: Limits) -> str:
    text = _field(data, name, str, "")
    if len(text) > limits.prompt_chars:
        raise BadRequest(f"{name}: longer than {limits.prompt_chars:,} characters")
    return text


PAGE_SETTINGS = tuple(f for f in generation_fields() if f.name not in ("stop", "num_samples"))
"""The generation settings the page sends: every field of the records but stop strings and several
samples, which a request refuses as unknown rather than ignoring."""
GENERATE_FIELDS = ("run", "prompt", *(f.name for f in PAGE_SETTINGS), "forced")
SAMPLING_FIELDS = tuple(f.name for f in setting_fields(SamplingOptions))
_KINDS = {"int": int, "float": float, "bool": bool}


def generate_request(data: dict[str, Any], limits: Limits) -> GenerateRequest:
    """The request's options, checked: bounded sizes, and sampling options scratchlm accepts. A
    field it does not know (stop strings, several samples) is refused, not silently ignored."""
    from scratchlm.generation.options import check_length_penalty, check_seed

    unknown = sorted(str(name)[:40] for name in data if name not in GENERATE_FIELDS)
    if unknown:
        raise BadRequest(f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                         f"the fields are {', '.join(GENERATE_FIELDS)}")
    given = {f.name: _field(data, f.name, _KINDS[f.kind], f.default, optional=f.optional) for f in PAGE_SETTINGS}
    if not 1 <= given["max_new_tokens"] <= limits.max_new_tokens:
        raise BadRequest(f"max_new_tokens: give 1 to {limits.max_new_tokens}, got {given['max_new_tokens']}")
    if not 1 <= given["beams"] <= 8:
        raise BadRequest(f"beams: give 1 to 8, got {given['beams']}")
    check_seed(given["seed"])  # a ConfigError (a UserError: 400), as the command line says it
    sampling = {name: given[name] for name in SAMPLING_FIELDS}
    SamplingOptions(**sampling)  # raises ConfigError (a UserError: 400) with the field and the rule
    check_length_penalty(given["length_penalty"])  # Python's JSON reader takes NaN and Infinity
    seed = given["seed"]
    return GenerateRequest(
        prompt=_text(data, "prompt", limits), max_new_tokens=given["max_new_tokens"],
        seed=secrets.randbelow(2**31) if seed is None else seed, beams=given["beams"],
        length_penalty=given["length_penalty"], sampling=sampling, forced=_forced(data, given["beams"], limits),
    )


def _forced(data: dict[str, Any], beams: int, limits: Limits) -> list[int]:
    """"forced": the ids a continuation starts with (the tokens kept, then the one the reader
    chose instead); their range is checked once the model is known (Playground.generate)."""
    forced = _field(data, "forced", list, [])
    if len(forced) > limits.forced_tokens:
        raise BadRequest(f"forced: at most {limits.forced_tokens:,} ids (the text kept before a chosen token), "
                         f"got {len(forced):,}; generate afresh from a prompt instead")
    if any(isinstance(i, bool) or not isinstance(i, int) for i in forced):
        raise BadRequest("forced: expected a list of token ids (whole numbers)")
    if forced and beams > 1:
        raise BadRequest("forced: a continuation from a chosen token is sampled; beams must be 1")
    return forced


class Playground:
    """The routes' state: the runs, the limits, the model thread, the streams running."""

    def __init__(self, library: RunLibrary, limits: Limits):
        self.library, self.limits = library, limits
        self.model_thread = ModelThread()
        self.streams = 0
        self.walk: dict[str, Any] | None = None  # the hand model's walkthrough, made once

    async def on_model_thread(self, fn, *args):
        return await asyncio.wrap_future(self.model_thread.call(fn, *args))

    async def load(self, name: Any):
        return await self.on_model_thread(self.library.load, name)

    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    async def generation_script(self, request: Request) -> Response:
        """/static/generation.js: the page's generation settings as the records define them (each
        field's name, kind, default and doc; which ones each kind of decoding leaves inert, and why),
        so settings.js and generate.js restate none of them."""
        inert = {kind: dict(zip(("names", "why"), inert_settings(*switches)))
                 for kind, switches in (("beams", (2, False)), ("greedy", (1, True)))}
        settings = {"fields": [dataclasses.asdict(f) for f in PAGE_SETTINGS], "inert": inert,
                    "beam_only": list(BEAM_ONLY)}
        script = f'"use strict";\n// made by the server (scratchlm/serve/app.py) from GenerationSettings and SamplingOptions\n' \
                 f"const GENERATION = {json.dumps(settings, ensure_ascii=False)};\n"
        return Response(script, media_type="text/javascript; charset=utf-8")

    async def runs(self, request: Request) -> Response:
        listed = await run_in_threadpool(lambda: [self.library.describe(e) for e in self.library.entries()])
        ready = [r["name"] for r in listed if r["checkpoint"] is not None and not r.get("error")]
        default = ready[0] if ready else listed[0]["name"] if listed else None  # the newest that can generate
        return JSONResponse({"runs": listed, "default": default})

    async def model_info(self, request: Request) -> Response:
        loaded = await self.load(request.query_params.get("run"))
        limits = self.limits
        return JSONResponse({
            "run": loaded.name, "checkpoint": loaded.info["checkpoint"].name, "step": loaded.info["step"],
            "config": loaded.model.config.to_dict(), "tokenizer": getattr(loaded.tokenizer, "kind", None),
            "params": sum(p.numel() for p in loaded.model.parameters()),
            "limits": {"max_new_tokens": limits.max_new_tokens, "prompt_chars": limits.prompt_chars,
                       "attention_tokens": limits.attention_tokens},
            "threads": await self.on_model_thread(torch.get_num_threads),  # as the thread that decodes sees it
        })

    async def generate(self, request: Request) -> Response:
        data = await _json_body(request, self.limits)
        req = generate_request(data, self.limits)
        loaded = await self.load(data.get("run"))
        # text the tokenizer cannot encode is a bad request (400, as on the attention tab), not a stream
        await self.on_model_thread(loaded.tokenizer.encode, req.prompt)
        vocab = loaded.engine.vocab or loaded.model.config.vocab_size  # as the engine draws: padding ids have no text
        if any(not 0 <= i < vocab for i in req.forced):
            raise BadRequest(f"forced: token ids are 0..{vocab - 1} for this model")
        return self._stream(loaded, req)

    async def chat(self, request: Request) -> Response:
        data = await _json_body(request, self.limits)
        messages = chat_messages(data.pop("messages", None), self.limits)
        if "prompt" in data:  # a field generate takes and a chat would ignore: refused, not ignored
            raise BadRequest("prompt: a chat sends messages, not a prompt")
        req = generate_request(data, self.limits)
        loaded = await self.load(data.get("run"))
        await self.on_model_thread(for_chat, loaded, req, messages)
        return self._stream(loaded, req)

    async def chat_template(self, request: Request) -> Response:
        data = await _json_body(request, self.limits)
        unknown = sorted(str(name)[:40] for name in data if name not in ("run", "messages", "train_on"))
        if unknown:
            raise BadRequest(f"unknown field(s) {', '.join(unknown)}; the fields are run, messages, train_on")
        messages = chat_messages(data.get("messages"), self.limits)
        train_on = _field(data, "train_on", str, "assistant")
        loaded = await self.load(data.get("run"))
        return JSONResponse(await self.on_model_thread(template_view, loaded, messages, train_on))

    def _stream(self, loaded: Loaded, req: GenerateRequest) -> Response:
        """The generation `req` as an event stream, one of at most limits.streams at once."""
        if self.streams >= self.limits.streams:
            raise BadRequest(f"{self.limits.streams} generations are running; try again when one ends", 503)
        self.streams += 1
        stream = GenerationStream(loaded, req, asyncio.get_running_loop())
        self.model_thread.add(stream)

        async def body():
            try:
                async for chunk in stream.events():
                    yield chunk
            finally:
                self.streams -= 1

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def attention(self, request: Request) -> Response:
        data = await _json_body(request, self.limits)
        source = attention_source(data, self.limits)
        loaded = await self.load(data.get("run"))
        return JSONResponse(await self.on_model_thread(attention_data, loaded, source, self.limits))

    async def inside(self, request: Request) -> Response:
        loaded = await self.load(request.query_params.get("run"))
        return JSONResponse(await self.on_model_thread(inside_data, loaded))

    async def walkthrough(self, request: Request) -> Response:
        if request.method == "POST":  # a run's own model on a text (a float64 copy: this one keeps generating)
            data = await _json_body(request, self.limits)
            text = _text(data, "text", self.limits)
            loaded = await self.load(data.get("run"))
            return JSONResponse(await self.on_model_thread(run_walk_data, loaded, text, self.limits))
        if self.walk is None:
            self.walk = await self.on_model_thread(walkthrough_data)
        return JSONResponse(self.walk)

    async def training(self, request: Request) -> Response:
        name = request.query_params.get("run")
        since = request.query_params.get("since", "0")
        if not (since.isascii() and since.isdigit() and len(since) <= 19):  # "²" is a digit to str.isdigit
            raise BadRequest(f"since: a byte offset (up to 19 digits), got {since[:20]!r}")
        entry = self.library.entry(name)  # one listing of the folder per poll
        metrics = self.library.metrics(entry)
        return JSONResponse(await run_in_threadpool(training_data, entry.run_dir, metrics, int(since), self.limits))


def create_app(library: RunLibrary, limits: Limits = Limits(), names: tuple[str, ...] = ()) -> Starlette:
    """The app; `names`: Host names it answers besides loopback's (guard.local_names)."""
    pg = Playground(library, limits)
    routes = [
        Route("/", pg.index),
        Route("/api/runs", _guarded(pg.runs)),
        Route("/api/model", _guarded(pg.model_info)),
        Route("/api/generate", _guarded(pg.generate), methods=["POST"]),
        Route("/api/chat", _guarded(pg.chat), methods=["POST"]),
        Route("/api/chat/template", _guarded(pg.chat_template), methods=["POST"]),
        Route("/api/attention", _guarded(pg.attention), methods=["POST"]),
        Route("/api/inside", _guarded(pg.inside)),
        Route("/api/walkthrough", _guarded(pg.walkthrough), methods=["GET", "POST"]),
        Route("/api/training", _guarded(pg.training)),
        Route("/static/generation.js", pg.generation_script),  # made from the records, not a file
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        quiet_accept_errors(asyncio.get_running_loop())
        yield
        pg.model_thread.close()  # its running streams are told to stop

    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(Guard, names=names)])
    app.state.model_thread = pg.model_thread
    return app


def attention_source(data: dict[str, Any], limits: Limits) -> str | list[int]:
    """What the attention view is asked about: "text" (encoded by the run's tokenizer) or "ids"
    (token ids as they are, e.g. a generated text's: its byte pieces need not survive a
    decode-encode round trip); exactly one of the two. The ids' range needs the model (attention_data)."""
    if ("text" in data) == ("ids" in data):
        raise BadRequest("give either text (a string) or ids (a list of token ids), not both" if "text" in data
                         else "give text (a string) or ids (a list of token ids)")
    if "text" in data:
        return _text(data, "text", limits)
    ids = _field(data, "ids", list)
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise BadRequest("ids: expected a list of token ids (whole numbers)")
    if not 1 <= len(ids) <= limits.attention_tokens:
        raise BadRequest(f"ids: give 1 to {limits.attention_tokens} token ids, got {len(ids)}")
    return ids


def attention_data(loaded, source: str | list[int], limits: Limits) -> dict[str, Any]:
    """Every layer's and head's weights for `source`: a text (encoded here) or token ids."""
    from scratchlm.inside.attention_maps import attention_weights, token_labels

    cfg = loaded.model.config
    name = "text" if isinstance(source, str) else "ids"
    ids = loaded.tokenizer.encode(source) if name == "text" else source
    most = min(cfg.block_size, limits.attention_tokens)
    if not ids:
        raise BadRequest("text: empty after tokenization; give some text")
    if len(ids) > most:
        raise BadRequest(f"{name}: {len(ids)} tokens; the attention view takes at most {most} "
                         f"(the model's context is {cfg.block_size})")
    vocab = getattr(loaded.tokenizer, "vocab_size", None) or cfg.vocab_size  # the tokenizer's: padding ids have no text
    if any(not 0 <= i < vocab for i in ids):
        bad = next(i for i in ids if not 0 <= i < vocab)
        raise BadRequest(f"ids: token ids are 0..{vocab - 1} for this model, got {str(bad)[:24]}")
    weights = attention_weights(loaded.model, ids)  # per layer (H, T, T)
    return {
        "ids": ids, "labels": token_labels(loaded.tokenizer, ids),  # drawn by tokenize_view.visible
        "n_layer": cfg.n_layer, "n_head": cfg.n_head,
        "weights": [w.tolist() for w in weights],
    }


def inside_data(loaded) -> dict[str, Any]:
    from scratchlm.inside.introspect import format_report, inspect_report

    model = loaded.model
    report = inspect_report(model, batch_size=2, seq_len=min(16, model.config.block_size))
    return {
        "config": report["config"], "total": report["parameters"]["total"],
        "params": [{"name": n, "shape": list(p.shape), "count": p.numel()} for n, p in model.named_parameters()],
        "components": report["parameters"]["rows"],
        "trace": report["trace"]["stations"],
        "report": format_report(report),
    }


def walkthrough_data() -> dict[str, Any]:
    from scratchlm.inside.walkthrough import WALKTHROUGH_IDS, walkthrough, walkthrough_json

    data = walkthrough_json(walkthrough(WALKTHROUGH_IDS))
    data["labels"] = list(HAND_TOKENS)
    return data


def run_walk_data(loaded: Loaded, text: str, limits: Limits) -> dict[str, Any]:
    """The Inside tab's walk of a run's model on `text` (run_walk_json), for a model of at most
    limits.walk_params parameters: the walk copies it in float64 and computes every station twice."""
    from scratchlm.inside.walkthrough_run import run_walk_json

    params = sum(p.numel() for p in loaded.model.parameters())
    if params > limits.walk_params:
        raise BadRequest(f"the Inside walk takes models of up to {limits.walk_params:,} parameters; this one has "
                         f"{params:,} (scratchlm walkthrough --checkpoint RUN walks any size on the command line)")
    return run_walk_json(loaded.model, loaded.tokenizer, text, loaded.name)


def training_data(run_dir: Path, metrics: Path | None, since: int, limits: Limits) -> dict[str, Any]:
    """The whole metrics lines written from byte `since` on (a line still being written waits for
    the next poll), and whether the run is training now. A line no poll can hold (longer than
    limits.metrics_bytes) or that is not JSON is skipped and named in "skipped"; a poll whose
    `since` falls inside a line (the rest of a long one) starts at the next line. "now": the
    server's clock, which wrote the records' "time" (a phone's own clock may differ)."""
    import time

    from scratchlm.runlock import holder

    records: list[dict] = []
    skipped: list[dict[str, Any]] = []
    offset, reset = since, False
    if metrics is not None:
        with open(metrics, "rb") as f:
            if since > f.seek(0, 2):  # the file is shorter than what was read: start it again
                since, reset = 0, True
            f.seek(max(since - 1, 0))
            inside_a_line = since > 0 and f.read(1) != b"\n"
            chunk = f.read(limits.metrics_bytes)
        start = chunk.find(b"\n") + 1 if inside_a_line else 0
        end = chunk.rfind(b"\n") + 1
        if inside_a_line and start == 0:  # the rest of a long line, still going on past this chunk
            start = end = len(chunk)
        elif end == 0 and len(chunk) == limits.metrics_bytes:  # a line no poll can hold
            skipped.append({"at": since, "why": f"a line longer than {limits.metrics_bytes:,} bytes"})
            start = end = len(chunk)  # the next poll begins inside it, and goes on from its end
        offset, at = since + end, since + start
        for line in chunk[start:end].splitlines(keepends=True):
            try:
                if line.strip():
                    records.append(json.loads(line))
            except ValueError:
                skipped.append({"at": at, "why": "not a JSON line"})
            at += len(line)
    return {"records": records, "next": offset, "reset": reset, "skipped": skipped,
            "training": holder(run_dir) is not None, "now": time.time()}
