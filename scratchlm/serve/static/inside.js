// Tab 4, Inside: what the selected model is made of (GET /api/inside), and a walkthrough: every
// intermediate matrix of one forward pass, of the hand-sized model (GET /api/walkthrough) or of
// the selected run's own model on a text (POST /api/walkthrough {run, text}).
"use strict";

const shapeText = (shape) => (shape.length ? shape.join("×") : "scalar");

// The tab was shown: load the model's description (once per model) and a walkthrough: the hand
// model's, unless the walk on show is of the selected run (another run's walk is taken down).
function insideShown() {
  wireWalk();
  if (!playground.inside || playground.inside.run !== playground.run) loadInside();
  prefillWalkText();
  const shown = playground.walkthrough;
  if (!shown || (shown.run && shown.run !== playground.run)) loadWalkthrough();
}

let walkWired = false;
let handWalk = null;     // the hand model's walk: it never changes, so it is asked for once
let walkPrefill = null;  // the text last put in #walk-text from the prompt

function wireWalk() {
  if (walkWired) return;
  walkWired = true;
  $("#walk-run").addEventListener("click", walkRun);
  $("#walk-hand").addEventListener("click", loadWalkthrough);
  $("#walk-text").addEventListener("input", (event) => fontHint(event.target.value));
}

// The text to walk is the Generate tab's prompt (or, when empty, the run's suggested one) until
// the reader edits it here.
function prefillWalkText() {
  const box = $("#walk-text");
  const prompt = $("#prompt").value || $("#prompt").placeholder;
  if (walkPrefill === null || box.value === walkPrefill) box.value = prompt;
  if (box.value === prompt) walkPrefill = prompt;
}

async function loadInside() {
  const run = playground.run;
  showError("inside-error", "");
  $("#inside-total").textContent = "…";
  try {
    const data = await fetchJSON(`/api/inside?run=${encodeURIComponent(run)}`);
    if (run !== playground.run) return; // the model changed while we waited
    playground.inside = { ...data, run };
    drawInside(data);
  } catch (err) {
    showError("inside-error", err.message);
  }
}

function drawInside(data) {
  const value = (v) => (v !== null && typeof v === "object" ? JSON.stringify(v) : String(v));
  $("#inside-config").replaceChildren(...Object.entries(data.config).map(([key, v]) =>
    el("tr", {}, el("th", {}, key), el("td", {}, value(v)))));
  $("#inside-total").textContent = fmtInt(data.total);
  $("#inside-params").replaceChildren(
    el("tr", {}, el("th", {}, "name"), el("th", {}, "shape"), el("th", { class: "num" }, "count")),
    ...data.params.map((p) => el("tr", { class: "param" },
      el("td", {}, p.name), el("td", {}, shapeText(p.shape)), el("td", { class: "num" }, fmtInt(p.count)))));
  $("#inside-trace").replaceChildren(
    el("tr", {}, el("th", {}, "station"), el("th", {}, "shape")),
    ...data.trace.map((t) => el("tr", { class: "station" }, el("td", {}, t.name), el("td", {}, shapeText(t.shape)))));
  $("#inside-report").textContent = data.report;
}

async function loadWalkthrough() {
  showError("walk-error", "");
  try {
    handWalk = handWalk || await fetchJSON("/api/walkthrough");
    showWalk(handWalk);
  } catch (err) {
    showError("walk-error", err.message);
  }
}

// Walk the selected run's model on the text in #walk-text.
async function walkRun() {
  const run = playground.run;
  const button = $("#walk-run");
  showError("walk-error", "");
  $("#walk-status").textContent = `walking ${run}…`;
  button.disabled = true;
  try {
    const data = await fetchJSON("/api/walkthrough", postJSON({ run, text: $("#walk-text").value }));
    if (run === playground.run) showWalk(data); // else the model changed while we waited
  } catch (err) {
    showError("walk-error", err.message);
  } finally {
    button.disabled = false;
    $("#walk-status").textContent = "";
  }
}

function showWalk(data) {
  playground.walkthrough = data;
  drawWalkthrough(data);
  $("#walk-matrix").replaceChildren(el("p", { class: "note" }, "Pick a station."));
}

// The label of each input position: `labels` may be one per input token, or the whole vocabulary.
function walkLabels(data) {
  const labels = data.labels || [];
  return labels.length === data.ids.length ? labels : data.ids.map((id) => labels[id] ?? String(id));
}

// What is walked, in words: the model, the input tokens (and a run's targets and next tokens).
function walkSummary(data) {
  const c = data.config;
  const input = `${walkLabels(data).join(" ")} (ids ${data.ids.join(", ")})`;
  const sizes = `T=${data.ids.length}, C=${c.n_embd}, heads=${c.n_head}, layers=${c.n_layer}, V=${c.vocab_size}`;
  const diff = `Largest difference from NumPy over all stations: ${data.max_diff.toExponential(1)}.`;
  if (!data.run) return `The hand-sized model. Input: ${input}; ${sizes}. ${diff}`;
  const next = data.next.map(([, label, p]) => `${label} ${fmtPct(p)}`).join(", ");
  return `Run ${data.run}, on ${data.ids.length} tokens. Input x: ${input}. Targets y (the text shifted `
    + `by one): ${data.target_labels.join(" ")}. ${sizes}. Likeliest tokens after the last input: ${next}. ${diff}`;
}

function drawWalkthrough(data) {
  const cropped = data.cropped ? [el("strong", { class: "cropped" }, ` The text makes ${fmtInt(data.row_tokens)} `
    + `input tokens; only the first ${data.limit} (BOS and the start of the text) are walked.`)] : [];
  $("#walk-summary").replaceChildren(walkSummary(data), ...cropped);
  if (data.run) fontHint(data.labels.join(""));
  const stations = data.steps.map((step) => {
    const button = el("button", { type: "button", class: "station", "data-key": step.key, title: step.key }, step.title);
    button.addEventListener("click", () => showMatrix(button, { ...step, values: step.torch }));
    return button;
  });
  $("#walk-stations").replaceChildren(...stations);
  $("#walk-weights").replaceChildren(...Object.entries(data.weights).map(([name, values]) => {
    const button = el("button", { type: "button", class: "weight", "data-name": name }, name);
    button.addEventListener("click", () => showMatrix(button, { title: name, key: name, values, max_diff: null }));
    return button;
  }));
}

// The shape of a nested array: [[1, 2, 3], [4, 5, 6]] -> [2, 3].
function shapeOf(values) {
  const shape = [];
  for (let v = values; Array.isArray(v); v = v[0]) shape.push(v.length);
  return shape;
}

// One matrix cell: 4 decimals, null is a masked score (−∞); tinted blue (+) or red (−).
function matrixCell(v, scale) {
  if (v === null) return el("td", { class: "neg-inf" }, "−∞");
  const td = el("td", {}, Math.abs(v) < 5e-5 ? "0.0000" : v.toFixed(4));
  const strength = scale > 0 ? Math.min(Math.abs(v) / scale, 1) * 0.45 : 0;
  td.style.backgroundColor = v >= 0 ? `rgba(60, 110, 220, ${strength})` : `rgba(225, 80, 60, ${strength})`;
  return td;
}

// A 1-D or 2-D array as a <table class="matrix">; rows (and columns) named by token when given.
function matrixTable(values, scale, rowNames, colNames) {
  const rows = Array.isArray(values[0]) ? values : [values];
  const corner = rowNames ? [el("th")] : [];
  const head = colNames ? [el("tr", {}, ...corner, ...colNames.map((name) => el("th", {}, name)))] : [];
  return el("table", { class: "matrix" }, ...head, ...rows.map((row, i) =>
    el("tr", {}, ...(rowNames ? [el("th", {}, rowNames[i])] : []), ...row.map((v) => matrixCell(v, scale)))));
}

// A station (or weight) clicked: its title, shape, values and the NumPy comparison.
// item: {title, values, max_diff (null for a weight), key (a station's trace key or the weight's
// name)}. A run's array too big to send has values null and its shape in the walk's "omitted".
function showMatrix(button, item) {
  for (const b of document.querySelectorAll(".walk-lists button")) b.classList.toggle("selected", b === button);
  const { values, max_diff: maxDiff } = item;
  if (values === null) {
    const big = playground.walkthrough.omitted[item.key];
    $("#walk-matrix").replaceChildren(el("h3", {}, item.title), el("p", { class: "note" }, `shape ${shapeText(big)}: `
      + `${fmtInt(big.reduce((a, b) => a * b, 1))} numbers, too many to show here.`));
    return;
  }
  const shape = shapeOf(values);
  const flat = shape.length ? values.flat(Infinity) : [values];
  const scale = flat.reduce((most, v) => (v === null ? most : Math.max(most, Math.abs(v))), 0);
  // a station's rows are the input tokens; scores, mask and weights have one column per token too
  const T = playground.walkthrough.ids.length;
  const labels = walkLabels(playground.walkthrough);
  const rowNames = maxDiff !== null && shape.length >= 2 && shape[shape.length - 2] === T ? labels : null;
  const colNames = rowNames && /(scores|mask|weights)$/.test(item.key || "") ? labels : null;
  const tables = [];
  if (!shape.length) tables.push(matrixTable([values], scale, null, null));
  else if (shape.length <= 2) tables.push(matrixTable(values, scale, rowNames, colNames));
  else values.forEach((part, h) => tables.push(el("figure", { class: "head" },
    el("figcaption", {}, `head ${h}`), matrixTable(part, scale, rowNames, colNames))));
  const diff = maxDiff === null ? "A weight of the model (torch layout: out × in)."
    : `NumPy twin: largest |torch − numpy| = ${maxDiff.toExponential(2)}`;
  $("#walk-matrix").replaceChildren(el("h3", {}, item.title),
    el("p", { class: "note" }, `shape ${shapeText(shape)}`), ...tables, el("p", { class: "note diff" }, diff));
}

