// The Generate tab's sampling settings: folded away on a narrow screen (the prompt and the
// output first), and the ones that cannot change this generation dimmed, with the same words
// `scratchlm generate` warns with.
"use strict";

// Which settings have no effect now, and why: the lists and words the command line warns with
// (scratchlm.generation.settings.inert_settings, sent in /static/generation.js).
function inertSettings() {
  const beams = parseInt($("#beams").value, 10) || 1;
  const temperature = $("#temperature").value.trim();
  if (beams > 1) return GENERATION.inert.beams;
  if ($("#greedy").checked || (temperature !== "" && parseFloat(temperature) === 0)) return GENERATION.inert.greedy;
  return { names: [], why: "" };
}

// A setting the reader changed from its default (what the command line's warning names); without
// beams a temperature of 0 is the switch to greedy decoding (generation.settings.setting_given).
function settingGiven(name, beams) {
  const input = document.getElementById(name);
  if (input.type === "checkbox") return input.checked;
  const value = input.value.trim();
  if (value === "") return false;
  const field = GENERATION.fields.find((f) => f.name === name);
  if (name === "temperature" && parseFloat(value) === 0 && beams === 1) return false;
  return field.default === null || parseFloat(value) !== field.default;
}

// A setting as its label on the page calls it (top-k, repetition penalty).
const settingLabel = (name) => document.getElementById(name).closest("label").textContent.trim();

// Dim what does not apply and say so under the settings when the reader set one of them: what
// this kind of decoding ignores, and with one beam what only beam search reads (length penalty).
function markInert() {
  const { names, why } = inertSettings();
  const beams = parseInt($("#beams").value, 10) || 1;
  const beamOnly = beams === 1 ? GENERATION.beam_only : [];
  for (const input of document.querySelectorAll("#settings input")) {
    const inert = names.includes(input.id) || beamOnly.includes(input.id);
    input.closest("label").classList.toggle("inert", inert);
    if (inert) input.setAttribute("aria-describedby", "settings-note");
    else input.removeAttribute("aria-describedby");
  }
  const given = names.filter((name) => settingGiven(name, beams)).map(settingLabel);
  const unread = beamOnly.filter((name) => settingGiven(name, beams)).map(settingLabel);
  const notes = [];
  if (given.length) notes.push(`${given.join(", ")} ${given.length === 1 ? "has" : "have"} no effect ${why}`);
  if (unread.length) notes.push(`${unread.join(", ")} ${unread.length === 1 ? "applies" : "apply"} to beam search only`);
  const note = $("#settings-note");
  note.textContent = notes.join("; ");
  note.hidden = !notes.length;
}

function wireSettings() {
  const settings = $("#settings");
  if (window.matchMedia("(max-width: 640px)").matches) settings.open = false;
  settings.addEventListener("input", markInert);
  settings.addEventListener("change", markInert);
  markInert();
}
