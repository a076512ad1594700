// Tab 2, Attention: POST /api/attention gives, for every layer and head, a T×T matrix of
// weights (row i: how much token i looks at each earlier token). Each is drawn as a small
// heatmap on a canvas; a click opens one big, with the tokens written along its sides.
"use strict";

// Colour of an attention weight w in [0, 1], as [r, g, b]: pale blue to deep blue. The scale
// is the square root of w, so that the many small weights still show.
function weightRGB(w) {
  const t = Math.sqrt(Math.min(Math.max(w, 0), 1));
  const from = [236, 242, 252], to = [18, 45, 115];
  return from.map((a, k) => Math.round(a + t * (to[k] - a)));
}
const FUTURE_RGB = [255, 255, 255]; // cells a token may not look at: plain white

// The legend under the token chips: what the colours of the maps mean.
function drawAttentionLegend() {
  const swatch = (rgb, text) => {
    const span = el("span", { class: "swatch" }, text);
    span.style.backgroundColor = `rgb(${rgb.join(",")})`;
    if (rgb[0] < 120) span.style.color = "#fff";
    return span;
  };
  $("#att-legend").replaceChildren("colour = attention weight (square-root scale): ",
    ...[0, 0.05, 0.2, 0.5, 1].map((w) => swatch(weightRGB(w), String(w))), swatch(FUTURE_RGB, "future (hidden)"));
}

// The tab was shown: offer the generate prompt as text; with a new model, recompute.
function attentionShown(runChanged) {
  const text = $("#att-text");
  if (!text.value.trim() && $("#prompt").value.trim()) text.value = $("#prompt").value;
  if (runChanged) {
    if (playground.attention && text.value.trim()) loadAttention();
    else clearAttention();
  }
}

function clearAttention() {
  attentionTicket += 1;  // an answer still on its way is for what was cleared
  $("#att-go").disabled = false;
  $("#att-status").textContent = "";
  playground.attention = null;
  for (const id of ["#att-tokens", "#att-legend", "#att-maps", "#att-focus"]) $(id).replaceChildren();
  $("#att-focus").hidden = true;
}

// #att-go: POST /api/attention and draw every map. Only the newest request draws: one made
// before the model changed (or before another click) is dropped when it answers.
let attentionTicket = 0;

async function loadAttention() {
  showError("att-error", "");
  const text = $("#att-text").value;
  if (!text.trim()) return showError("att-error", "write some text first");
  const ticket = ++attentionTicket;
  $("#att-go").disabled = true;
  $("#att-status").textContent = "computing…";
  try {
    const data = await fetchJSON("/api/attention", postJSON({ run: playground.run, text }));
    if (ticket !== attentionTicket) return;
    playground.attention = data;
    drawAttention(data);
    $("#att-status").textContent = `${data.ids.length} tokens, ${data.n_layer} layers × ${data.n_head} heads`;
  } catch (err) {
    if (ticket !== attentionTicket) return;
    $("#att-status").textContent = "";
    showError("att-error", err.message);
  } finally {
    if (ticket === attentionTicket) $("#att-go").disabled = false;
  }
}

// The tokens as chips, then one small heatmap per layer and head.
function drawAttention(data) {
  $("#att-tokens").replaceChildren(...data.labels.map((label, i) =>
    el("span", { class: "att-label", "data-index": i, title: `token ${i}, id ${data.ids[i]}` }, label)));
  drawAttentionLegend();
  const maps = $("#att-maps");
  maps.replaceChildren();
  maps.style.setProperty("--heads", data.n_head);
  data.weights.forEach((layer, l) => layer.forEach((matrix, h) => {
    const canvas = el("canvas", { role: "img", "aria-label": `attention of layer ${l}, head ${h}` });
    drawHeatmap(canvas, matrix);
    const figure = el("figure", { class: "attmap", "data-layer": l, "data-head": h, tabindex: "0" },
      canvas, el("figcaption", {}, `layer ${l}, head ${h}`));
    figure.addEventListener("click", () => openFocus(l, h));
    figure.addEventListener("keydown", (e) => { if (e.key === "Enter") openFocus(l, h); });
    maps.append(figure);
  }));
  $("#att-focus").hidden = true;
}

// Paint a T×T matrix onto a canvas, one pixel per cell; CSS scales it up with crisp edges.
// Cells right of the diagonal (the future) are grey.
function drawHeatmap(canvas, matrix) {
  const T = matrix.length;
  canvas.width = T;
  canvas.height = T;
  const context = canvas.getContext("2d");
  const image = context.createImageData(T, T);
  for (let i = 0; i < T; i++) {
    for (let j = 0; j < T; j++) {
      const rgb = j > i ? FUTURE_RGB : weightRGB(matrix[i][j]);
      image.data.set([...rgb, 255], 4 * (i * T + j));
    }
  }
  context.putImageData(image, 0, 0);
}

// The focus view: one map drawn big, keys along the top, queries down the left.
function openFocus(layer, head) {
  const data = playground.attention;
  const matrix = data.weights[layer][head];
  const T = matrix.length;
  const cell = Math.max(14, Math.min(32, Math.floor(560 / T)));
  for (const fig of document.querySelectorAll(".attmap")) {
    fig.classList.toggle("selected", +fig.dataset.layer === layer && +fig.dataset.head === head);
  }
  const label = (i, axis) => el("span", { class: "att-label", "data-index": i, "data-axis": axis }, data.labels[i]);
  const keys = el("div", { class: "focus-keys" }, ...data.labels.map((_, j) => label(j, "key")));
  const queries = el("div", { class: "focus-queries" }, ...data.labels.map((_, i) => label(i, "query")));
  const canvas = el("canvas", { class: "focus-map" });
  drawHeatmap(canvas, matrix);
  const grid = el("div", { class: "focus-grid" }, el("div", { class: "focus-corner" }, "query ↓ key →"),
    keys, queries, canvas);
  grid.style.setProperty("--cell", `${cell}px`);
  grid.style.setProperty("--T", T);
  const readout = el("p", { id: "att-readout", class: "readout" }, "Point at a cell.");
  const close = el("button", { type: "button", class: "close" }, "close");
  close.addEventListener("click", () => { $("#att-focus").hidden = true; });
  const pick = (event) => focusCell(event, canvas, matrix, readout, grid);
  canvas.addEventListener("mousemove", pick);
  canvas.addEventListener("click", pick);
  const focus = $("#att-focus");
  focus.replaceChildren(el("div", { class: "focus-head" }, el("h3", {}, `layer ${layer}, head ${head}`), close),
    el("div", { class: "focus-scroll" }, grid), readout);
  focus.dataset.layer = layer;
  focus.dataset.head = head;
  focus.hidden = false;
  focus.scrollIntoView({ block: "nearest" });
}

// The pointer is over cell (i, j) of the focus map: say its weight, light up its two labels.
function focusCell(event, canvas, matrix, readout, grid) {
  const box = canvas.getBoundingClientRect();
  const T = matrix.length;
  const j = Math.floor(((event.clientX - box.left) / box.width) * T);
  const i = Math.floor(((event.clientY - box.top) / box.height) * T);
  if (i < 0 || j < 0 || i >= T || j >= T) return;
  const labels = playground.attention.labels;
  const weight = j > i ? "0 (the future is hidden)" : matrix[i][j].toFixed(4);
  readout.textContent = `${labels[i]} → ${labels[j]}: ${weight}`;
  for (const span of grid.querySelectorAll(".att-label")) {
    const index = Number(span.dataset.index);
    span.classList.toggle("hot", span.dataset.axis === "query" ? index === i : index === j);
  }
}

