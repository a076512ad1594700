// The browser side of `scratchlm serve`, its starting point: the tabs (routing by the address's
// #hash), the model picker, and the wiring of buttons to the functions in the tab scripts.
// Plain JavaScript, no framework and no build step. Read common.js first, then each tab's file.
"use strict";

const TABS = ["generate", "chat", "attention", "inside", "training"];

// Show the tab named in the address (#generate, ...), hide the others, and tell the tabs.
function route() {
  const name = location.hash.slice(1);
  const tab = TABS.includes(name) ? name : "generate";
  const previous = playground.tab;
  playground.tab = tab;
  for (const t of TABS) {
    document.getElementById("tab-" + t).hidden = t !== tab;
    const link = document.getElementById("nav-" + t);
    if (t === tab) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  hideAlts();
  if (previous === "training" && tab !== "training") stopPolling();
  showTab(tab, false);
}

// A tab has just been shown (or the model changed: runChanged is true): load what it needs.
function showTab(tab, runChanged) {
  if (!playground.run) return;  // nothing to show until a run is listed
  if (tab === "attention") attentionShown(runChanged);
  if (tab === "inside") insideShown();
  if (tab === "training") trainingShown(runChanged);
}

// Fill the model picker from GET /api/runs. The answer may be a list of names or of
// {name, ...} objects, or {"runs": [...], "default": name}. Called at start and again every
// RUNS_EVERY_MS and when the window gets focus, so runs that appear (or step on) while the page
// is open show up; the model chosen stays chosen while it is listed.
async function loadRuns() {
  const select = $("#run");
  try {
    const data = await fetchJSON("/api/runs");
    const runs = Array.isArray(data) ? data : data.runs || [];
    const names = runs.map((r) => (typeof r === "string" ? r : r.name));
    if (!names.length) {
      select.replaceChildren();
      if (playground.run) {  // the last run went away: nothing of it stays on show
        playground.run = "";
        suggestPrompt();
        playground.inside = null;
        resetTraining();
        clearAttention();
      }
      runsError("no runs in the served folder yet: train one into it (scratchlm train --preset " +
        "shakespeare-char --out_dir FOLDER/baby) and it will appear in the picker");
      return;
    }
    const options = runs.map(runOption);
    const shown = [...select.options].map((o) => o.value + "|" + o.textContent).join("\n");
    if (shown !== options.map((o) => o.value + "|" + o.textContent).join("\n")) select.replaceChildren(...options);
    const wanted = playground.run || (!Array.isArray(data) && data.default) || names[0];
    select.value = names.includes(wanted) ? wanted : names[0];
    runsError("");
    const option = select.selectedOptions[0];
    if (((option && option.dataset.prompt) || "") !== playground.suggested) suggestPrompt();  // a checkpoint appeared
    if (select.value !== playground.run) {
      playground.run = select.value;
      suggestPrompt();
      if (playground.ready) runChanged();  // a first run appeared, or the one shown went: show the one chosen
    }
  } catch (err) {
    runsError("could not list the models: " + err.message);
  }
}

// Show (or, with "", take back) the picker's own line in #page-error; a line something else
// wrote there since stays.
function runsError(message) {
  const ours = playground.runsError && $("#page-error").textContent === "Error: " + playground.runsError;
  playground.runsError = message;
  if (message || ours) showError("page-error", message);
}

const RUNS_EVERY_MS = 10000;

// One <option> for a run: its name, the step of its checkpoint (as last listed), and what keeps
// it from generating: training now (it generates from its last checkpoint), no checkpoint yet,
// files that cannot be read.
function runOption(run) {
  if (typeof run === "string") return el("option", { value: run }, run);
  const step = typeof run.step === "number" ? ` · step ${fmtInt(run.step)}` : "";
  const marks = [];
  if (run.training) marks.push("training");
  if (run.error) marks.push("cannot be read");
  else if (!run.checkpoint) marks.push("no checkpoint yet");
  const marked = marks.length ? ` (${marks.join(", ")})` : "";
  const model = run.error || (run.model && run.model.n_layer ? `${run.model.n_layer} layers, ${run.model.n_embd} wide` : null);
  const option = el("option", { value: run.name, title: model }, run.name + step + marked);
  if (run.prompt) option.dataset.prompt = run.prompt;
  return option;
}

// The chosen run's own first prompt (a Tang run's 床前明月光) goes into an empty prompt box, or
// replaces the one the last run put there; text the reader typed stays.
function suggestPrompt() {
  const option = $("#run").selectedOptions[0];
  const suggested = (option && option.dataset.prompt) || "";
  const box = $("#prompt");
  box.placeholder = suggested || "ROMEO:";
  if (!box.value || box.value === playground.suggested) box.value = suggested;
  fontHint(box.value);
  playground.suggested = suggested;
}

// The picker changed: forget what belonged to the old model and reload the tab shown.
function runChanged() {
  playground.run = $("#run").value;
  suggestPrompt();
  playground.inside = null;
  resetTraining();
  stopChat();
  resetChat();  // a conversation belongs to the model it was held with
  showTab(playground.tab, true);
}

// ---------------------------------------------------------------- start

function wire() {
  wireOutput();
  wireFollow();
  wireSettings();
  $("#go").addEventListener("click", generateClicked);
  $("#stop").addEventListener("click", stopGeneration);
  $("#prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !$("#go").disabled) generateClicked();
  });
  $("#att-go").addEventListener("click", loadAttention);
  wireAttention();
  wireChat();
  for (const box of ["#prompt", "#att-text"]) $(box).addEventListener("input", (event) => fontHint(event.target.value));
  $("#run").addEventListener("change", runChanged);
  window.addEventListener("hashchange", route);
  window.addEventListener("focus", loadRuns);
  setInterval(loadRuns, RUNS_EVERY_MS);
  // a click or tap outside a token closes its popup; Escape too, and it stops a stream
  document.addEventListener("click", (event) => { if (!event.target.closest("#alts")) hideAlts(); });
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    if (closeAltsToToken()) return;  // Escape in the popup: back to its token; the stream goes on
    hideAlts();
    stopGeneration();
    stopChat();
  });
  // an unexpected failure shows on the page, not only in the console
  window.addEventListener("error", (event) => showError("page-error", event.message));
  window.addEventListener("unhandledrejection", (event) => showError("page-error", String(event.reason)));
}

async function main() {
  wire();
  drawLegend();
  drawTraining();
  await loadRuns();
  route();
  playground.ready = true;
}

main();
