// Tab 1, Generate: send the prompt and settings to POST /api/generate, read the answer as a
// stream of Server-Sent Events, and show each token as it arrives, shaded by how likely the
// model found it; pointing at a token shows the alternatives the model weighed.
"use strict";

const gen = { running: false, stopped: false, reader: null, startedAt: 0, pending: document.createDocumentFragment(),
  flushTimer: null, start: null, follow: true, body: null, task: null, hideTimer: null };

// Read a number input: "" gives null (the setting is off), otherwise an int or a float.
function numberField(id, integer) {
  const text = document.getElementById(id).value.trim();
  if (text === "") return null;
  const value = integer ? parseInt(text, 10) : parseFloat(text);
  if (Number.isNaN(value)) throw new Error(`${id} is not a number: ${text}`);
  return value;
}

// The JSON body of POST /api/generate, from the controls: one per setting of the records
// (GENERATION, from /static/generation.js), an empty field giving the setting's default.
function generateRequest() {
  const body = { run: playground.run, prompt: $("#prompt").value };
  for (const field of GENERATION.fields) {
    body[field.name] = field.kind === "bool" ? document.getElementById(field.name).checked
      : numberField(field.name, field.kind === "int") ?? field.default;
  }
  return body;
}

// Set the status line and its data-state (idle, running, done, stopped, error). The status line
// changes with every batch of tokens; a screen reader hears only `announce`'s few words (the
// start and the end), said through the quiet live region #announce.
function setStatus(state, text, announce) {
  const status = $("#status");
  status.dataset.state = state;
  status.textContent = text;
  if (announce !== undefined) $("#announce").textContent = announce;
}

// Generate and Stop take turns; the keyboard focus moves with them rather than falling to the page.
function setRunning(running) {
  const [from, to] = running ? [$("#go"), $("#stop")] : [$("#stop"), $("#go")];
  const focused = document.activeElement === from;
  to.disabled = false;
  if (focused) to.focus({ preventScroll: true });  // the reader may be following the text below
  from.disabled = true;
}

// Stop the stream being read, if any (the Stop button, and Escape anywhere on the page): the
// answer's reader is cancelled, which closes the connection, and the server stops generating for
// a reader gone.
function stopGeneration() {
  if (!gen.running) return;
  gen.stopped = true;
  if (gen.reader) gen.reader.cancel().catch(() => {});
}

// #go (and Ctrl+Enter): a new generation from the controls.
function generateClicked() {
  let body;
  try {
    body = generateRequest();
  } catch (err) {
    showError("gen-error", "");
    return failGeneration(err.message);
  }
  gen.task = startGeneration(body);
}

// Send one request and read the answer as a stream of Server-Sent Events.
async function startGeneration(body) {
  showError("gen-error", "");
  gen.body = body;
  playground.tokens = [];
  playground.done = null;
  hideAlts();
  const output = $("#output");
  output.replaceChildren(el("span", { class: "prompt" }, body.prompt));
  for (const name of ["tokens", "seconds"]) delete $("#status").dataset[name];
  setStatus("running", "sending the prompt…", "generating");
  setRunning(true);
  Object.assign(gen, { running: true, stopped: false, reader: null, start: null, follow: true,
    startedAt: performance.now() });
  try {
    const response = await fetch("/api/generate", postJSON(body));
    if (!response.ok) {
      const data = await response.json().catch(() => null);
      throw new Error((data && data.error) || `${response.status} ${response.statusText}`);
    }
    gen.reader = response.body.getReader();
    if (gen.stopped) gen.reader.cancel().catch(() => {});  // Stop came before the answer
    const finished = await readEvents(gen.reader, onGenerateEvent);
    if (gen.stopped && !finished) stoppedGeneration();
    else if (!finished) failGeneration("the connection closed before the end of the text");
  } catch (err) {
    if (gen.stopped) stoppedGeneration();
    else failGeneration(err instanceof TypeError ? lostServer(err) : err.message);
  } finally {
    gen.running = false;
    setRunning(false);
  }
}

// Read a Server-Sent Events stream ("event: NAME\ndata: JSON\n\n"), calling onEvent(name, data)
// for each whole event. Chunks from the network may hold several events, or part of one, so
// text is kept in a buffer until a blank line ends an event. Returns true when onEvent said
// the stream is finished (it returns true for done and error).
async function readEvents(reader, onEvent) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
    buffer = buffer.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (handleBlock(block, onEvent)) return drained(reader);
    }
    if (done) return buffer.trim() !== "" && handleBlock(buffer, onEvent);
  }
}

// The server ends the response right after its last event: read to that end rather than leave
// the rest of the answer unread.
async function drained(reader) {
  try {
    while (!(await reader.read()).done);
  } catch (err) {
    // the text is complete; a connection lost after its last event changes nothing
  }
  return true;
}

// The words for a request that got no answer at all, or lost its connection after n tokens
// (the Chat tab's too).
function lostServer(err, n = playground.tokens.length) {
  const where = n ? `the connection to the server broke after ${n} tokens` : "the server did not answer";
  return `${where}: is scratchlm serve still running? (${err.message})`;
}

// One event's lines: "event: name" and "data: ..." (several data lines join with a newline);
// lines starting with ":" are comments (keep-alives).
function handleBlock(block, onEvent) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return false;
  return onEvent(name, JSON.parse(data.join("\n")));
}

// What to do with each event of /api/generate; true means the stream is over.
function onGenerateEvent(name, data) {
  if (name === "start") {
    gen.start = data;
    const seed = data.seed !== undefined && data.seed !== null ? `, seed ${data.seed}` : "";
    setStatus("running", `prompt: ${data.prompt_ids} tokens${croppedNote()}${seed}${continuing()}; generating…`);
  } else if (name === "token") {
    addToken(data);
  } else if (name === "done") {
    finishGeneration(data);
    return true;
  } else if (name === "error") {
    failGeneration(data.message);
    return true;
  }
  return false;
}

// Background colour of a token by its probability p: orange when unlikely, clear when likely;
// grey when there is none (null: the scores held a NaN or an infinity).
function pColour(p) {
  if (p === null || p === undefined) return "rgba(160, 164, 171, 0.35)";
  const alpha = 0.8 * Math.pow(1 - Math.min(Math.max(p, 0), 1), 1.5);
  return `rgba(245, 140, 40, ${alpha.toFixed(3)})`;
}

// One token event as a <span class="tok">, shaded by its probability (the Chat tab's too).
function tokenSpan(token, attrs) {
  const span = el("span", { class: "tok", "data-id": token.id, "data-p": String(token.p), ...attrs }, token.text);
  // a newline alone, or no text yet (part of a character), would be invisible: CSS marks them
  if (token.text.includes("\n")) span.classList.add("newline");
  if (token.text === "") span.classList.add("partial");
  span.style.backgroundColor = pColour(token.p);
  return span;
}

// Append one generated token to #output as a <span class="tok">.
function addToken(token) {
  playground.tokens.push(token);
  const span = tokenSpan(token, { "data-index": token.index,
    tabindex: token.index === 0 ? "0" : "-1" });  // one Tab stop for the whole text; arrows move within it
  const forced = (gen.body && gen.body.forced) || [];
  if (token.forced) span.classList.add(token.index === forced.length - 1 ? "taken" : "kept");
  gen.pending.append(span);
  if (gen.flushTimer === null) gen.flushTimer = setTimeout(flushTokens, FLUSH_MS);
}

// Tokens reach the page in batches, FLUSH_MS apart: a re-layout and repaint per token would
// cost the browser more than the model spends making it (and on a small machine the browser
// and the model share the same cores).
const FLUSH_MS = 100;

function flushTokens() {
  if (gen.flushTimer !== null) clearTimeout(gen.flushTimer);
  gen.flushTimer = null;
  if (gen.pending.childNodes.length) $("#output").append(gen.pending);  // empties the fragment
  if (gen.follow) keepEndInView();
  const n = playground.tokens.length;
  if (n && $("#status").dataset.state === "running") {
    setStatus("running", `prompt: ${gen.start ? gen.start.prompt_ids : "?"} tokens${croppedNote()}; ` +
      `generating… ${n} tokens`);
  }
}

const croppedNote = () => (gen.start && gen.start.cropped ? " (cropped to the model's context window)" : "");

// A continuation from a token the reader chose says so on the status line.
function continuing() {
  const forced = (gen.body && gen.body.forced) || [];
  return forced.length ? `; continuing from token ${forced.length} as you chose it` : "";
}

// Following the stream: the newest token is kept on screen while it grows (on a phone the
// output starts below the prompt and the settings), unless the reader scrolls away; scrolling
// back down to the end follows again.
function lastShown() {
  const output = $("#output");
  return output.lastElementChild || output;
}

function endInView() {
  const box = lastShown().getBoundingClientRect();
  return box.bottom > 0 && box.top < window.innerHeight;
}

function keepEndInView() {
  const box = lastShown().getBoundingClientRect();
  const margin = 24;  // a little room under the newest line
  if (box.bottom > window.innerHeight - margin) window.scrollBy(0, box.bottom - window.innerHeight + margin);
  else if (box.top < 0) window.scrollBy(0, box.top - margin);
}

// The reader scrolling on their own: up stops the following (for this stream); down to where
// the end is in view follows again.
function readerScrolled(up) {
  if (!gen.running) return;
  if (up) gen.follow = false;
  else setTimeout(() => { if (endInView()) gen.follow = true; }, 150);  // once the scroll has landed
}

function wireFollow() {
  window.addEventListener("wheel", (event) => readerScrolled(event.deltaY < 0), { passive: true });
  let touchedAt = 0;
  window.addEventListener("touchstart", () => { touchedAt = window.scrollY; }, { passive: true });
  window.addEventListener("touchend", () => readerScrolled(window.scrollY < touchedAt), { passive: true });
  window.addEventListener("keydown", (event) => {
    const up = { PageUp: true, ArrowUp: true, Home: true, PageDown: false, ArrowDown: false, End: false }[event.key];
    if (up !== undefined && !event.target.closest("input, textarea, select, #output")) readerScrolled(up);
  });
}

// The done event: the summary line, timed on the server's clock, and (beam search) the text.
function finishGeneration(done) {
  flushTokens();
  fontHint(done.text);
  playground.done = done;
  const received = playground.tokens.length;
  if (!received && done.text) $("#output").append(el("span", { class: "beam-text" }, done.text));
  // text held back to the very end (the start of a stop string that never came) is done's only
  const streamed = playground.tokens.map((t) => t.text).join("");
  if (received && done.text.length > streamed.length && done.text.startsWith(streamed)) {
    $("#output").append(el("span", { class: "tail" }, done.text.slice(streamed.length)));
  }
  const n = received || done.tokens;
  // the server's clock, from taking the request to its last token: tokens reach the page in
  // batches (SEND_EVERY apart), so the page's own first-to-last interval says little
  const seconds = done.seconds;
  const rate = seconds > 0 && n ? `${(n / seconds).toFixed(1)} tokens/s` : "no rate";
  const first = typeof done.first_token_seconds === "number" ? `, the first after ${fmtSeconds(done.first_token_seconds)}` : "";
  const status = $("#status");
  status.dataset.tokens = n;
  status.dataset.seconds = seconds;
  const logprob = typeof done.logprob === "number" ? `, log-probability ${done.logprob.toFixed(3)}` : "";
  const line = `${n} tokens in ${fmtSeconds(seconds)} (${rate}${first})${croppedNote()}`;
  if (done.reason === "stopped") {  // the page's own Stop reads no done event: this one is the server's
    setStatus("done", `${line}; ended early: the server is shutting down (scratchlm serve was stopped)`, "ended early");
    return;
  }
  const why = { length: "the token limit", eos: "the end-of-text token", stop: "a stop sequence" }[done.reason]
    || done.reason;
  setStatus("done", `${line}${continuing()}; ended by ${why}${logprob}`, `done: ${n} tokens`);
}

// Seconds as a person reads them: "0.42 s", "85 ms".
const fmtSeconds = (s) => (s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`);

function stoppedGeneration() {
  flushTokens();
  const n = playground.tokens.length;
  const seconds = (performance.now() - gen.startedAt) / 1000;
  $("#status").dataset.tokens = n;
  setStatus("stopped", `stopped after ${n} tokens (${fmtSeconds(seconds)} after Generate)${croppedNote()}`,
    `stopped after ${n} tokens`);
}

function failGeneration(message) {
  flushTokens();
  setStatus("error", "failed", "failed");
  showError("gen-error", message);
}

// Pointing at, leaving and clicking token spans: one listener each on #output for all of them
// (a stream adds hundreds of spans; none needs listeners of its own).
function wireOutput() {
  const output = $("#output");
  const tokenOf = (event) => event.target.closest && event.target.closest("#output .tok");
  output.addEventListener("mouseover", (event) => {
    const span = tokenOf(event);
    if (span) showAlts(span, false);
  });
  output.addEventListener("mouseout", (event) => {
    const span = tokenOf(event);
    if (span && !span.contains(event.relatedTarget)) hideSoon();
  });
  const popup = $("#alts");
  popup.addEventListener("mouseenter", () => clearTimeout(gen.hideTimer));
  popup.addEventListener("mouseleave", hideSoon);
  output.addEventListener("click", (event) => {
    const span = tokenOf(event);
    if (!span) return;
    event.stopPropagation();  // the page's own click handler would close the popup again
    showAlts(span, true);
  });
  // the keyboard: Tab reaches the text (one stop), the arrows go from token to token, and the
  // token in focus shows its popup as pointing at it does
  output.addEventListener("focusin", (event) => {
    const span = tokenOf(event);
    if (!span) return;
    for (const other of output.querySelectorAll(".tok[tabindex='0']")) other.tabIndex = -1;
    span.tabIndex = 0;
    showAlts(span, false);
  });
  output.addEventListener("focusout", (event) => {
    const into = event.relatedTarget;
    if (tokenOf(event) && !output.contains(into) && !popup.contains(into) && !popup.dataset.pinned) hideAlts();
  });
  output.addEventListener("keydown", (event) => {
    const span = tokenOf(event);
    if (span && event.key === "Enter") {  // pin the popup and go into it: its buttons
      showAlts(span, true);
      const first = $("#alts button");
      if (first) first.focus();
      event.preventDefault();
      return;
    }
    const step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }[event.key];
    if (!span || !step) return;
    const next = output.querySelector(`.tok[data-index='${Number(span.dataset.index) + step}']`);
    if (next) next.focus();
    event.preventDefault();
  });
}

// The popup #alts for one token: its label, p (the model's probability) and q (the draw's, after
// the settings), then the five tokens the model found likeliest, each with both and a button to
// take it instead (reached by pinning the popup: a click, a tap, or Enter on a focused token).
function showAlts(span, pinned) {
  const token = playground.tokens[Number(span.dataset.index)];
  if (!token) return;
  clearTimeout(gen.hideTimer);
  const popup = $("#alts");
  const alts = [...(token.top || [])];
  if (!alts.some((alt) => alt.id === token.id)) alts.push({ id: token.id, label: token.label, p: token.p, q: token.q });
  const rows = alts.map((alt) => altRow(token, alt));
  const taken = token.forced ? (span.classList.contains("taken") ? "you chose this token" : "kept from before your choice")
    : "the draw chose this token";
  popup.replaceChildren(
    el("div", { class: "alts-head" }, "token ", el("code", {}, token.label), ` · ${taken}`),
    el("table", { class: "alts-table" },
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "token"),
        el("th", { scope: "col", class: "num", title: "the model's own probability, of its raw scores" }, "model p"),
        el("th", { scope: "col", class: "num", title: "the probability in the draw, after your settings" }, "draw q"),
        el("th", { scope: "col" }, el("span", { class: "sr-only" }, "action")))),
      el("tbody", {}, ...rows)),
    el("div", { class: "alts-sub" }, "p: the model's own probability. q: the same after the repetition penalty, " +
      "temperature and the filters (top-k, top-p, min-p) you set; grey: filtered out, q = 0" +
      (sameQ(alts) ? ". Your settings change nothing here: q = p." : ".")),
    el("div", { class: "alts-actions" }, el("button", { type: "button", class: "attention-at" }, "attention at this step →")),
  );
  popup.querySelector(".attention-at").addEventListener("click", () => attentionAt(token.index));
  popup.dataset.index = token.index;
  if (pinned) popup.dataset.pinned = "1";
  else delete popup.dataset.pinned;
  popup.hidden = false;
  placeNear(popup, span);
}

const sameQ = (alts) => alts.every((alt) => alt.q === alt.p);

// One row of the popup's table: the token, p, q, and "take this instead" (not for the token taken).
function altRow(token, alt) {
  const chosen = alt.id === token.id;
  const filtered = alt.q === 0 && !chosen;
  const greedy = Boolean(gen.body && (gen.body.greedy || gen.body.temperature === 0));
  const take = chosen ? el("td", {}, "taken") : el("td", {}, el("button", {
    type: "button", class: "take", "data-id": alt.id, "aria-label": `take ${alt.label} instead`,
    title: "continue the text from this token instead" }, "take this instead"));
  if (!chosen) take.firstChild.addEventListener("click", (event) => {
    event.stopPropagation();
    takeInstead(token.index, alt.id);
  });
  return el("tr", { class: ["alt", chosen ? "chosen" : "", filtered ? "filtered" : ""].join(" ").trim(),
    "data-id": alt.id, "data-p": String(alt.p), "data-q": String(alt.q),
    title: !filtered ? null : greedy ? "greedy takes only the likeliest token" :
      "filtered out by your settings: the draw could not take it" },
  el("td", {}, el("code", {}, alt.label)), el("td", { class: "num" }, fmtPct(alt.p)),
  el("td", { class: "num" }, alt.q === undefined ? "–" : fmtPct(alt.q)), take);
}

// "take this instead": the text up to that token stays, the chosen token comes next, and the
// model goes on from there with the same settings (the ids are sent as `forced`, so the server
// computes every kept step again and the text up to the choice is the same token for token).
async function takeInstead(index, id) {
  hideAlts();
  if (gen.running) {
    stopGeneration();
    await gen.task;
  }
  const forced = playground.tokens.slice(0, index).map((t) => t.id).concat([id]);
  const body = { ...gen.body, forced };
  gen.task = startGeneration(body);
  await gen.task;
  const taken = $(`#output .tok[data-index='${index}']`);
  // back to the chosen token, unless the reader has since moved on (typing, or a new generation)
  const idle = document.activeElement === document.body || document.activeElement === $("#go");
  if (taken && gen.body === body && idle) taken.focus({ preventScroll: true });
}

// "attention at this step": the token at `index` was chosen from the scores at the position
// before it; the Attention tab shows what that position attended to, in every layer and head,
// over the ids the model saw then (its context: the last block_size of them).
async function attentionAt(index) {
  hideAlts();
  const run = gen.body.run;  // the model that made the text, whatever the picker shows now
  let info;
  try {
    info = await fetchJSON(`/api/model?run=${encodeURIComponent(run)}`);
  } catch (err) {
    return showError("gen-error", `cannot open the attention of ${run}: ${err.message}`);
  }
  const context = info.config.block_size;
  const ids = gen.start.start_ids.concat(playground.tokens.slice(0, index).map((t) => t.id)).slice(-context);
  const seen = ids.slice(-info.limits.attention_tokens);
  const token = playground.tokens[index];
  const who = token.forced && index === (gen.body.forced || []).length - 1 ? "You chose" : "The model chose";
  const cut = seen.length < ids.length ? ` Recomputed on the last ${seen.length} tokens only (the view's limit): ` +
    `the model saw ${ids.length}, so these weights differ from the ones it used.` : "";
  openAttentionRow({ run, ids: seen, position: seen.length - 1, caption: `${who} ${token.label} as token ` +
    `${index + 1}, from the scores at the position before it: what that position attended to, in every layer ` +
    `and head (${run}).${cut}` });
}

// Put the popup just under the element (above it when there is no room below), on screen.
function placeNear(popup, target) {
  const box = target.getBoundingClientRect();
  const width = popup.offsetWidth;
  const height = popup.offsetHeight;
  const left = Math.min(Math.max(4, box.left), document.documentElement.clientWidth - width - 4);
  const below = box.bottom + 6;
  const top = below + height < window.innerHeight ? below : Math.max(4, box.top - height - 6);
  popup.style.left = `${left + window.scrollX}px`;
  popup.style.top = `${top + window.scrollY}px`;
}

function hideAlts() {
  clearTimeout(gen.hideTimer);
  const popup = $("#alts");
  popup.hidden = true;
  delete popup.dataset.pinned;
}

// The pointer left a token or the popup: close it a moment later, unless the pointer has come
// into the popup (to reach its buttons across the gap) or it was pinned.
function hideSoon() {
  clearTimeout(gen.hideTimer);
  gen.hideTimer = setTimeout(() => { if (!$("#alts").dataset.pinned) hideAlts(); }, 250);
}

// Escape inside a pinned popup unpins it and gives the focus back to its token (whose focus shows
// the popup again, unpinned, as for any token in focus; a second Escape closes it and stops).
function closeAltsToToken() {
  const popup = $("#alts");
  if (popup.hidden || !popup.contains(document.activeElement)) return false;
  const span = $(`#output .tok[data-index='${popup.dataset.index}']`);
  hideAlts();
  if (span) span.focus();
  return true;
}

// The legend under the output: what the token colours mean.
function drawLegend() {
  const swatches = [0.02, 0.2, 0.5, 0.8, 0.98].map((p) => {
    const swatch = el("span", { class: "swatch" }, fmtPct(p).replace(".00", ""));
    swatch.style.backgroundColor = pColour(p);
    return swatch;
  });
  $("#p-legend").replaceChildren("colour = how likely the model found the token it took: ", ...swatches);
}

