// The Generate tab's sampling settings: folded away on a narrow screen (the prompt and the
// output first), and the ones that cannot change this generation dimmed, with the same words
// `scratchlm generate` warns with.
"use strict";

const SAMPLING = ["temperature", "top_k", "top_p", "min_p", "seed"];

// Which settings have no effect now, and why, as the command line decides it
// (cli/main.py: ignored_generate_flags).
function inertSettings() {
  const beams = parseInt($("#beams").value, 10) || 1;
  const temperature = $("#temperature").value.trim();
  if (beams > 1) {
    return { names: [...SAMPLING, "repetition_penalty", "greedy"],
      why: "with beams (beam search ranks by log-probability)" };
  }
  if ($("#greedy").checked || (temperature !== "" && parseFloat(temperature) === 0)) {
    return { names: SAMPLING, why: "with greedy decoding (it takes the likeliest token)" };
  }
  return { names: [], why: "" };
}

// A setting the reader changed from its default (what the command line's warning names).
function settingGiven(name) {
  const input = document.getElementById(name);
  if (input.type === "checkbox") return input.checked;
  const value = input.value.trim();
  if (value === "") return false;
  if (name === "temperature") return parseFloat(value) !== 1 && parseFloat(value) !== 0;
  if (name === "repetition_penalty") return parseFloat(value) !== 1;
  return true;
}

const settingLabel = (name) => ({ top_k: "top-k", top_p: "top-p", min_p: "min-p",
  repetition_penalty: "repetition penalty" }[name] || name);

// Dim what does not apply and say so under the settings when the reader set one of them.
function markInert() {
  const { names, why } = inertSettings();
  for (const input of document.querySelectorAll("#settings input")) {
    const inert = names.includes(input.id);
    input.closest("label").classList.toggle("inert", inert);
    if (inert) input.setAttribute("aria-describedby", "settings-note");
    else input.removeAttribute("aria-describedby");
  }
  const given = names.filter(settingGiven).map(settingLabel);
  const note = $("#settings-note");
  note.textContent = given.length ? `${given.join(", ")} ${given.length === 1 ? "has" : "have"} no effect ${why}` : "";
  note.hidden = !given.length;
}

function wireSettings() {
  const settings = $("#settings");
  if (window.matchMedia("(max-width: 640px)").matches) settings.open = false;
  settings.addEventListener("input", markInert);
  settings.addEventListener("change", markInert);
  markInert();
}
