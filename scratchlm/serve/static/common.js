// The playground's shared pieces: its state (window.playground) and small helpers for the DOM
// and for asking the server. The page loads the scripts in order (see index.html): this one,
// then one per tab, then app.js, which starts everything. They are plain scripts, not modules,
// so a name declared at the top of one file is visible in the files loaded after it.
"use strict";

// Everything the page knows, in one place (tests read it too).
const playground = {
  run: "",            // the selected run (model); "" until the runs are listed
  runsError: "",      // the line the model picker last wrote in #page-error, if any
  suggested: "",      // the prompt the chosen run put in the prompt box (suggestPrompt)
  tab: "generate",    // the tab shown
  tokens: [],         // the token events of the last generation
  done: null,         // its done event
  attention: null,    // the last /api/attention answer
  attentionRow: null, // the query row shown in every head: {position, caption}, or null
  inside: null,       // the last /api/inside answer (with .run)
  walkthrough: null,  // the walk on show: /api/walkthrough's answer (a run's has .run)
  training: { records: [], next: 0, training: false, skipped: 0 },
};
window.playground = playground;

const $ = (selector) => document.querySelector(selector);

// Create an element: el("td", {class: "x", "data-id": 3}, "text", childElement, ...).
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

// A whole number with thousands separators: 12345 -> "12,345".
const fmtInt = (n) => Math.round(n).toLocaleString("en-US");
// A probability as a percentage with two decimals: 0.12345 -> "12.35%"; none (null) -> "–".
const fmtPct = (p) => (p === null || p === undefined ? "–" : (100 * p).toFixed(2) + "%");

// Show (or, with an empty message, hide) the red error line with this id.
function showError(id, message) {
  const line = document.getElementById(id);
  line.textContent = message ? "Error: " + message : "";
  line.hidden = !message;
}

// Fetch JSON; a failed request throws an Error carrying the server's {"error": ...} message.
async function fetchJSON(url, options = {}) {
  const response = await fetch(url, options);
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error((data && (data.error || data.message)) || `${response.status} ${response.statusText}`);
  }
  if (data === null) throw new Error(`${url} did not answer with JSON`);
  return data;
}

// The options for a JSON POST request.
const postJSON = (body, signal) => ({
  method: "POST",
  headers: { "Content-Type": "application/json" },
  body: JSON.stringify(body),
  signal,
});


// Chinese text with no font to draw it shows as boxes, and nothing else says why. Whether this
// browser has such a font: 床 drawn on a canvas comes out pixel for pixel like a private-use code
// point no font draws (U+10FFFD), the same empty box, when none has it.
const HAN = /[\u3400-\u9fff\uf900-\ufaff]/;
let hanMissing = null;

function hanFontMissing() {
  if (hanMissing === null) {
    const drawn = (text) => {
      const canvas = el("canvas", { width: 40, height: 40 });
      const ctx = canvas.getContext("2d");
      ctx.font = "28px sans-serif";
      ctx.fillText(text, 4, 32);
      return ctx.getImageData(0, 0, 40, 40).data.join(",");
    };
    hanMissing = drawn("床") === drawn("\u{10FFFD}");
  }
  return hanMissing;
}

// Show the font hint when Chinese text is on show (in `texts`) and this browser cannot draw it.
function fontHint(...texts) {
  if (!texts.some((t) => HAN.test(t || "")) || !hanFontMissing()) return;
  $("#font-hint").hidden = false;
}
