// Tab 3, Attention: POST /api/attention gives, for every layer and head, a T×T matrix of
// weights (row i: how much token i looks at each earlier token). Each is drawn as a small
// heatmap on a canvas (a button: Enter or a click opens it big, in a dialog). Choosing a token
// (a chip here, or a token of the Generate tab: openAttentionRow) shows its row in every head.
"use strict";

// Colour of an attention weight w in [0, 1], as [r, g, b]: pale blue to deep blue. The scale
// is the square root of w, so that the many small weights still show.
function weightRGB(w) {
  const t = Math.sqrt(Math.min(Math.max(w, 0), 1));
  const from = [236, 242, 252], to = [18, 45, 115];
  return from.map((a, k) => Math.round(a + t * (to[k] - a)));
}
const FUTURE_RGB = [255, 255, 255]; // cells a token may not look at: plain white

// A touch screen has nothing to point with: its words say "tap" (as the CSS does for .hint.keys).
const TOUCH = window.matchMedia("(hover: none), (pointer: coarse)");
const CELL_HINT = () => (TOUCH.matches ? "Tap a cell to read its weight."
  : "Point at a cell, or move with the arrow keys, to read its weight.");

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
  playground.attentionRow = null;
  closeFocus();
  for (const id of ["#att-tokens", "#att-legend", "#att-maps", "#att-row"]) $(id).replaceChildren();
  $("#att-row").hidden = true;
}

// Only the newest request draws: one made before the model changed (or before another click)
// is dropped when it answers.
let attentionTicket = 0;

// POST /api/attention with `body` ({run, text} or {run, ids}) and draw every map; the answer,
// or null when it failed (the error is shown) or a newer request overtook it.
async function requestAttention(body) {
  showError("att-error", "");
  const ticket = ++attentionTicket;
  $("#att-go").disabled = true;
  $("#att-status").textContent = "computing…";
  try {
    const data = await fetchJSON("/api/attention", postJSON(body));
    if (ticket !== attentionTicket) return null;
    playground.attention = data;
    drawAttention(data);
    $("#att-status").textContent = `${data.ids.length} tokens, ${data.n_layer} layers × ${data.n_head} heads`;
    return data;
  } catch (err) {
    if (ticket !== attentionTicket) return null;
    $("#att-status").textContent = "";
    showError("att-error", err.message);
    return null;
  } finally {
    if (ticket === attentionTicket) $("#att-go").disabled = false;
  }
}

// #att-go: the text in the box.
async function loadAttention() {
  const text = $("#att-text").value;
  if (!text.trim()) return showError("att-error", "write some text first");
  await requestAttention({ run: playground.run, text });
}

// Called from the Generate tab's token popup: show the Attention tab for these token ids, and
// query `position`'s row in every layer and head, under `caption`. Resolves when drawn.
async function openAttentionRow({ ids, position, caption = "", run = playground.run }) {
  if (location.hash !== "#attention") location.hash = "#attention";  // app.js's route() shows the tab
  if (!Array.isArray(ids) || !ids.length || !Number.isInteger(position) || position < 0 || position >= ids.length) {
    showError("att-error", `no token at position ${position} of ${Array.isArray(ids) ? ids.length : 0}`);
    return;
  }
  const data = await requestAttention({ run, ids });
  if (!data) return;
  showAttentionRow(position, caption);
  const title = $("#att-row-title");
  title.focus({ preventScroll: true });  // the reader lands on what they asked for, at the top
  title.scrollIntoView({ block: "start" });
}

// The tokens as chips (one tab stop; the arrows go from chip to chip and choose), then one small
// heatmap per layer and head.
function drawAttention(data) {
  closeFocus();
  playground.attentionRow = null;
  $("#att-row").replaceChildren();
  $("#att-row").hidden = true;
  const chips = data.labels.map((label, i) => el("button", {
    type: "button", class: "att-label", "data-index": i, "aria-pressed": "false", tabindex: i ? "-1" : "0",
    title: `token ${i}, id ${data.ids[i]}`, "aria-label": `${i} «${label}»`,
  }, label));
  $("#att-tokens").replaceChildren(...chips);
  drawAttentionLegend();
  const maps = $("#att-maps");
  maps.replaceChildren();
  maps.style.setProperty("--heads", data.n_head);
  data.weights.forEach((layer, l) => layer.forEach((matrix, h) => {
    const canvas = el("canvas", { role: "img", "aria-label": `attention of layer ${l}, head ${h}` });
    drawHeatmap(canvas, matrix);
    const open = el("button", { type: "button", class: "attmap-open",
      "aria-label": `layer ${l}, head ${h}: open it big` }, canvas, el("span", { class: "att-rowmark", hidden: "" }));
    open.addEventListener("click", () => openFocus(l, h, open));
    maps.append(el("figure", { class: "attmap", "data-layer": l, "data-head": h },
      open, el("figcaption", {}, `layer ${l}, head ${h}`)));
  }));
}

// Chips: a click, Enter or an arrow key chooses the token whose row every head then shows.
function wireAttentionChips() {
  const chips = $("#att-tokens");
  const chipOf = (event) => event.target.closest && event.target.closest("#att-tokens .att-label");
  chips.addEventListener("click", (event) => {
    const chip = chipOf(event);
    if (chip) showAttentionRow(Number(chip.dataset.index), "");
  });
  chips.addEventListener("keydown", (event) => {
    const chip = chipOf(event);
    const count = chips.children.length;
    if (!chip || !count) return;
    const at = Number(chip.dataset.index);
    const to = { ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1,
      Home: 0, End: count - 1 }[event.key];
    if (to === undefined) return;
    event.preventDefault();
    const next = chips.children[Math.min(Math.max(to, 0), count - 1)];
    showAttentionRow(Number(next.dataset.index), "");
    next.focus();
  });
}

// Paint a T×T matrix onto a canvas, one pixel per cell; CSS scales it up with crisp edges.
// Cells right of the diagonal (the future) are white.
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

// "12 «o»": a position and its token, as the readout and the rows name them.
const tokenName = (i) => `${i} «${playground.attention.labels[i]}»`;
const ROW_TOP = 5;  // keys listed first in a head's row: its largest weights

// Query `position`'s row in every layer and head: marked on each small map, and listed per head
// (the largest weights first; every key in order under "all keys").
function showAttentionRow(position, caption) {
  const data = playground.attention;
  if (!data) return;
  const T = data.ids.length;
  playground.attentionRow = { position, caption };
  for (const chip of $("#att-tokens").children) {
    const chosen = Number(chip.dataset.index) === position;
    chip.setAttribute("aria-pressed", String(chosen));
    chip.tabIndex = chosen ? 0 : -1;
  }
  for (const mark of document.querySelectorAll("#att-maps .att-rowmark")) {
    mark.style.top = `${(100 * position) / T}%`;
    mark.style.height = `${100 / T}%`;
    mark.hidden = false;
  }
  const heads = [];
  data.weights.forEach((layer, l) => layer.forEach((matrix, h) => heads.push(headRow(l, h, matrix[position]))));
  const title = el("h3", { id: "att-row-title", tabindex: "-1" },
    `Query ${tokenName(position)}: where it looks, in every head`);
  const parts = [title];  // (its CSS scroll-margin keeps it clear of the sticky header)
  if (caption) parts.push(el("p", { class: "att-caption" }, caption));
  parts.push(el("p", { class: "note" }, `Each list: the keys (tokens 0 to ${position}) this head gives the most ` +
    "weight; the weights of a row add up to 1."), el("div", { class: "att-heads" }, ...heads));
  $("#att-row").replaceChildren(...parts);
  $("#att-row").hidden = false;
}

// One head's row: its largest weights first, then every key in order (folded).
function headRow(layer, head, row) {
  const keys = row.map((w, j) => ({ j, w })).filter(({ j }) => j <= playground.attentionRow.position);
  const item = ({ j, w }) => {
    const bar = el("span", { class: "att-bar" });
    bar.style.width = `${Math.round(100 * w)}%`;
    return el("li", { "data-key": j, "data-weight": String(w) }, el("span", { class: "att-key" }, tokenName(j)),
      el("span", { class: "att-w" }, w.toFixed(3)), bar);
  };
  const top = [...keys].sort((a, b) => b.w - a.w).slice(0, ROW_TOP);
  const block = el("section", { class: "att-head", "data-layer": layer, "data-head": head },
    el("h4", {}, `layer ${layer}, head ${head}`), el("ol", { class: "att-top" }, ...top.map(item)));
  if (keys.length > ROW_TOP) {
    block.append(el("details", {}, el("summary", {}, `all ${keys.length} keys in order`),
      el("ol", { class: "att-all", start: "0" }, ...keys.map(item))));
  }
  return block;
}

// ---------------------------------------------------------------- the map drawn big

// Cells at least this wide carry their tokens along both sides, horizontally in a ≥ 12 px font;
// narrower ones (a long text, a phone) would need sideways or clipped letters no one can read,
// so the sides show positions every few cells instead and the readout names the tokens.
const LABELLED_CELL = 20;
const MAX_CELL = 32;

// Cell size for T tokens in `width` pixels: never wider than the dialog (no sideways scroll).
function focusGeometry(T, width) {
  const labelled = Math.min(MAX_CELL, Math.floor((width - 76) / T));
  if (labelled >= LABELLED_CELL) return { cell: labelled, side: 76, labelled: true };
  const cell = Math.max(2, Math.min(MAX_CELL, Math.floor((width - 34) / T)));
  const every = [1, 2, 5, 10, 20, 50].find((k) => k * cell >= 24) || 100;  // ticks ≥ 24 px apart
  return { cell, side: 34, labelled: false, every };
}

// The dialog's parts for one head; drawn again when the window's size changes.
function openFocus(layer, head, opener) {
  const dialog = $("#att-focus");
  const data = playground.attention;
  if (!data) return;
  for (const fig of document.querySelectorAll(".attmap")) {
    fig.classList.toggle("selected", +fig.dataset.layer === layer && +fig.dataset.head === head);
  }
  const close = el("button", { type: "button", class: "close" }, "close");
  close.addEventListener("click", closeFocus);
  dialog.replaceChildren(el("div", { class: "focus-head" },
    el("h3", { id: "att-focus-title" }, `layer ${layer}, head ${head}`), close),
  el("div", { class: "focus-body" }),
  el("p", { id: "att-readout", class: "focus-readout", "aria-live": "polite" }, CELL_HINT()));
  dialog.dataset.layer = layer;
  dialog.dataset.head = head;
  focusView.opener = opener || document.activeElement;
  placeFocus();
  if (!dialog.open) dialog.showModal();
  const row = playground.attentionRow;
  const i = row ? row.position : data.ids.length - 1;
  const weights = data.weights[layer][head][i];
  drawFocus(layer, head, i, weights.indexOf(Math.max(...weights.slice(0, i + 1))));
  $("#att-focus .focus-map").focus({ preventScroll: true });  // the cursor's cell is scrolled to instead
}

// The dialog goes just below the header (sticky on a desktop; on a phone it scrolls away, and
// back when the page behind is scrolled up), never under it.
function placeFocus() {
  const header = document.querySelector("header.top").getBoundingClientRect();
  $("#att-focus").style.setProperty("--focus-top", `${Math.max(0, header.bottom) + 8}px`);
}

// The state of the dialog: what opened it (focus returns there) and the cursor cell.
const focusView = { opener: null, layer: 0, head: 0, i: 0, j: 0, geometry: null };

function drawFocus(layer, head, i, j) {
  const data = playground.attention;
  const T = data.ids.length;
  const body = $("#att-focus .focus-body");
  const g = focusGeometry(T, body.clientWidth);
  Object.assign(focusView, { layer, head, geometry: g });
  const canvas = el("canvas");
  drawHeatmap(canvas, data.weights[layer][head]);
  const map = el("div", { class: "focus-map", tabindex: "0", role: "application", "aria-describedby": "att-readout",
    "aria-label": `attention map of layer ${layer}, head ${head}: the arrow keys move between cells` },
  canvas, el("div", { class: "focus-cursor" }));
  const grid = el("div", { class: g.labelled ? "focus-grid labelled" : "focus-grid" },
    el("div", { class: "focus-corner" }, g.labelled ? "query ↓ key →" : "↓→"),
    focusAxis(T, g, "key"), focusAxis(T, g, "query"), map);
  grid.style.setProperty("--cell", `${g.cell}px`);
  grid.style.setProperty("--side", `${g.side}px`);
  grid.style.setProperty("--T", T);
  body.replaceChildren(grid);
  // the keys' side stays in sight just under the title (CSS: sticky at --head-h)
  $("#att-focus").style.setProperty("--head-h", `${$("#att-focus .focus-head").offsetHeight}px`);
  const pick = (event) => {
    const box = canvas.getBoundingClientRect();
    const at = (d, size) => Math.min(T - 1, Math.max(0, Math.floor((d / size) * T)));
    setFocusCell(at(event.clientY - box.top, box.height), at(event.clientX - box.left, box.width), true, false);
  };
  map.addEventListener("mousemove", pick);
  map.addEventListener("click", pick);
  map.addEventListener("keydown", focusKeys);
  setFocusCell(i, j, false, true);
}

// One side of the big map: every token (labelled cells) or a position every few cells.
function focusAxis(T, g, axis) {
  const labels = playground.attention.labels;
  const axisEl = el("div", { class: `focus-${axis === "key" ? "keys" : "queries"}`, "aria-hidden": "true" });
  for (let k = 0; k < T; k++) {
    if (g.labelled) {
      axisEl.append(el("span", { class: "att-label", "data-index": k, "data-axis": axis, title: tokenName(k) },
        labels[k]));
    } else if (k % g.every === 0) {
      const tick = el("span", { class: "att-tick", "data-index": k }, String(k));
      tick.style.setProperty("--at", k);
      axisEl.append(tick);
    }
  }
  return axisEl;
}

// Move the cursor to query i, key j: outline it, light up its labels, say its weight (`say`),
// and scroll it into view (`scroll`: not under a pointer, which would see the map move away).
function setFocusCell(i, j, say, scroll) {
  const data = playground.attention;
  Object.assign(focusView, { i, j });
  const cursor = $("#att-focus .focus-cursor");
  cursor.style.setProperty("--i", i);
  cursor.style.setProperty("--j", j);
  for (const span of document.querySelectorAll("#att-focus .att-label")) {
    const index = Number(span.dataset.index);
    span.classList.toggle("hot", span.dataset.axis === "query" ? index === i : index === j);
  }
  if (scroll) cursor.scrollIntoView({ block: "nearest" });
  if (!say) return;
  const w = data.weights[focusView.layer][focusView.head][i][j];
  const weight = j > i ? "hidden (the future)" : w.toFixed(3);
  const readout = $("#att-readout");
  readout.textContent = `query ${tokenName(i)} → key ${tokenName(j)}: ${weight}`;
  readout.dataset.query = i;
  readout.dataset.key = j;
}

// Arrow keys on the big map: up and down go from query to query, left and right from key to
// key within what that query may see; Home and End: its first key and itself.
function focusKeys(event) {
  const T = playground.attention.ids.length;
  let { i, j } = focusView;
  if (event.key === "ArrowUp") i -= 1;
  else if (event.key === "ArrowDown") i += 1;
  else if (event.key === "ArrowLeft") j -= 1;
  else if (event.key === "ArrowRight") j += 1;
  else if (event.key === "Home") j = 0;
  else if (event.key === "End") j = i;
  else return;
  event.preventDefault();
  i = Math.min(Math.max(i, 0), T - 1);
  j = Math.min(Math.max(j, 0), i);
  setFocusCell(i, j, true, true);
}

// Close the dialog (the close button, Escape) and give the focus back to what opened it.
function closeFocus() {
  const dialog = $("#att-focus");
  if (!dialog.open) return;
  dialog.close();
  const opener = focusView.opener;
  focusView.opener = null;
  if (opener && opener.isConnected) opener.focus();
}

function wireAttention() {
  wireAttentionChips();
  const dialog = $("#att-focus");
  // Escape: handled here so that it only closes (the page's own Escape also stops a generation)
  dialog.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    event.preventDefault();
    event.stopPropagation();
    closeFocus();
  });
  dialog.addEventListener("cancel", (event) => { event.preventDefault(); closeFocus(); });
  window.addEventListener("resize", () => {
    if (!dialog.open) return;
    const hadFocus = document.activeElement && document.activeElement.classList.contains("focus-map");
    placeFocus();
    drawFocus(focusView.layer, focusView.head, focusView.i, focusView.j);  // (a phone turned on its side)
    if (hadFocus) $("#att-focus .focus-map").focus({ preventScroll: true });
  });
  window.addEventListener("scroll", () => { if (dialog.open) placeFocus(); }, { passive: true });
}
