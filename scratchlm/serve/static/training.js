// Tab 5, Training: while the tab is shown, ask GET /api/training every second for the run's new
// metrics records (scratchlm.training.progress writes them). From them: the step out of the run's
// total, the time left at the run's own pace, whether it trains or evaluates, the loss curves
// (SVG drawn at the chart's real width, so its text keeps its size on a phone; a point's values
// on hover, tap or the arrow keys) and the run's samples.
"use strict";

const train = {
  active: false, epoch: 0, timer: null,
  width: 0,      // the chart's width when last drawn (0: not drawn, the tab hidden)
  points: [],    // the chart's points by step: {step, train, val, px, py}
  shown: null,   // the step whose values the readout shows, or null
};
const SAMPLES_SHOWN = 20;

function trainingShown(runChanged) {
  if (runChanged) resetTraining();
  startPolling();
}

// A new model: start again from its first record.
function resetTraining() {
  stopPolling();
  playground.training = { records: [], next: 0, training: false, skipped: 0, now: 0 };
  train.shown = null;
  drawTraining();
}

function startPolling() {
  if (train.active) return;
  train.active = true;
  train.epoch += 1;
  poll(train.epoch);
}

// Stop asking; an answer still on its way is then ignored (its epoch is old).
function stopPolling() {
  train.active = false;
  train.epoch += 1;
  clearTimeout(train.timer);
}

// Ask for the records after the last one we have, draw them, and ask again in a second.
async function poll(epoch) {
  const state = playground.training;
  const url = `/api/training?run=${encodeURIComponent(playground.run)}&since=${state.next}`;
  try {
    const data = await fetchJSON(url);
    if (epoch !== train.epoch) return;
    showError("train-error", "");
    if (data.reset) [state.records, state.skipped] = [[], 0]; // the metrics file was started again
    state.records.push(...data.records);
    state.next = data.next;
    const skipped = (data.skipped || []).length;  // lines too long for a poll, or not JSON
    state.skipped = (state.skipped || 0) + skipped;
    const changed = data.records.length > 0 || skipped > 0 || state.training !== data.training || !state.polled;
    state.training = data.training;
    state.now = data.now;  // the server's clock, which wrote the records' times
    state.polled = true;
    if (changed) drawTraining();
    else drawProgress();  // the clocks moved on: time left, time since the last record
  } catch (err) {
    if (epoch !== train.epoch) return;
    showError("train-error", err.message);
  }
  train.timer = setTimeout(() => poll(epoch), 1000);
}

// The last record of an event kind that has a given number field.
function latest(records, event, field) {
  for (let i = records.length - 1; i >= 0; i--) {
    const r = records[i];
    if (r.event === event && (!field || typeof r[field] === "number")) return r;
  }
  return null;
}

// The records of the run's latest sitting (from its last start or resume record on), and that record.
function sitting(records) {
  for (let i = records.length - 1; i >= 0; i--) {
    const r = records[i];
    if (r.event === "start" || r.event === "resume") return { begin: r, records: records.slice(i) };
  }
  return { begin: null, records };
}

// The run's own settings, as its start (or resume) record holds them: {} where there is none.
const runConfig = (records) => {
  const { begin } = sitting(records);
  return (begin && begin.config && typeof begin.config === "object") ? begin.config : {};
};

// Seconds as "45 s", "3 min 20 s" or "2 h 5 min".
function fmtDuration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

// Everything from the records, redrawn when new ones came.
function drawTraining() {
  const { records } = playground.training;
  const lastTrain = latest(records, "train", "tokens_per_s");
  $("#train-tps").textContent = lastTrain ? `${fmtInt(lastTrain.tokens_per_s)} tokens/s` : "–";
  const trainPoints = lossPoints(records, "train", (r) => r.loss_mean ?? r.loss);
  const valPoints = lossPoints(records, "eval", (r) => r.val_loss);
  const lastOf = (points) => (points.length ? points[points.length - 1][1].toFixed(3) : "–");
  $("#train-loss").textContent = `${lastOf(trainPoints)} / ${lastOf(valPoints)}`;
  drawProgress();
  drawChart($("#train-chart"), trainPoints, valPoints);
  drawSamples(records);
}

// The status line, step / total, time left and how often points come: these move with the clock too.
function drawProgress() {
  const { records, training, skipped, now } = playground.training;
  const clock = now || Date.now() / 1000;
  const status = statusOf(records, training, clock);
  const skippedText = skipped ? `; ${skipped} line${skipped === 1 ? "" : "s"} of the log skipped (too long or not JSON)` : "";
  $("#train-status").textContent = status.text + skippedText;
  $("#train-status").dataset.skipped = skipped || 0;
  $("#train-status").dataset.training = training;
  $("#train-status").dataset.state = status.state;
  const [stepText, totalText] = stepOfTotal(records);
  $("#train-step").textContent = stepText;
  $("#train-total").textContent = totalText;
  const [etaText, paceText] = timeLeft(records, training, clock);
  $("#train-eta").textContent = etaText;
  $("#train-pace").textContent = paceText;
  $("#train-cadence").textContent = cadence(records, clock);
}

// What the run is doing: {state: "training" | "evaluating" | "idle", text}. Training is the run
// folder's lock being held; an evaluation runs from its eval_start record until its eval record.
function statusOf(records, training, now) {
  const last = records[records.length - 1];
  const at = (r) => (typeof r.step === "number" ? " at step " + fmtInt(r.step) : "");
  const evaluating = last && last.event === "eval_start";
  if (training && evaluating) {
    const batches = runConfig(records).eval_iters;
    const on = last.full ? "the whole validation split"
      : (batches ? `${fmtInt(batches)} batches of validation text` : "validation text");
    const since = typeof last.time === "number" ? `, for ${fmtDuration(now - last.time)} so far` : "";
    return { state: "evaluating", text: `evaluating${at(last)} on ${on}${since}` };
  }
  if (training) return { state: "training", text: "training now" };
  if (evaluating) {
    return { state: "idle", text: `not training: it stopped during an evaluation${at(last)} (no result recorded)` };
  }
  const lastText = last ? (last.event || "a record") + at(last) : "none";
  return { state: "idle", text: `not training (last record: ${lastText})` };
}

// ["step / total", where the total comes from]: the run's max_steps, and its time limit if it has one.
function stepOfTotal(records) {
  const lastStep = [...records].reverse().find((r) => typeof r.step === "number");
  if (!lastStep) return ["–", ""];
  const cfg = runConfig(records);
  if (typeof cfg.max_steps !== "number") return [fmtInt(lastStep.step), "total unknown: the log has no start record"];
  const stepText = `${fmtInt(lastStep.step)} / ${fmtInt(cfg.max_steps)}`;
  if (!cfg.time_limit) return [stepText, "max_steps in the run's config"];
  const lastTrain = latest(sitting(records).records, "train", "trained_s");
  const trained = lastTrain ? `; ${fmtDuration(lastTrain.trained_s)} trained` : "";
  return [stepText, `max_steps, or time_limit ${fmtDuration(cfg.time_limit)} if it comes first${trained}`];
}

// The run's pace in this sitting: seconds per step between its first and last train records.
function pace(records) {
  const trains = sitting(records).records.filter((r) => r.event === "train" && typeof r.step === "number" &&
    typeof r.time === "number");
  if (trains.length < 2) return null;
  const first = trains[0], last = trains[trains.length - 1];
  if (last.step <= first.step) return null;
  return { perStep: (last.time - first.time) / (last.step - first.step), first, last };
}

// ["time left", how it was reckoned]: the steps left at the run's pace (or the time limit's rest,
// when sooner), less the time since the last train record; by the server's clock.
function timeLeft(records, training, now) {
  const last = records[records.length - 1];
  if (!training) return [last && last.event === "end" ? "done" : "–", ""];
  const cfg = runConfig(records), p = pace(records);
  if (typeof cfg.max_steps !== "number" || !p) return ["–", "(after two log records of this sitting)"];
  let left = Math.max(0, cfg.max_steps - p.last.step) * p.perStep;
  const limit = cfg.time_limit && typeof p.last.trained_s === "number" ? cfg.time_limit - p.last.trained_s : null;
  if (limit !== null) left = Math.min(left, Math.max(0, limit));
  left = Math.max(0, left - (now - p.last.time));
  const perStep = p.perStep >= 1 ? `${p.perStep.toFixed(1)} s` : `${(p.perStep * 1000).toFixed(0)} ms`;
  return [`about ${fmtDuration(left)}`,
    `at ${perStep} a step over steps ${fmtInt(p.first.step)}–${fmtInt(p.last.step)}, evaluations in that span included`];
}

// How often the curve can move, in the run's own settings, and how old its last record is.
function cadence(records, now) {
  const cfg = runConfig(records), last = records[records.length - 1];
  const every = (n, what) => (n > 0 ? `${what} every ${fmtInt(n)} steps` : `${what} at the end only`);
  const run = typeof cfg.log_interval === "number"
    ? `The run writes a ${every(cfg.log_interval, "training loss")} (log_interval) and a ` +
      `${every(cfg.eval_interval, "validation loss")} (eval_interval); `
    : "";
  const age = last && typeof last.time === "number" ? ` Its last record is ${fmtDuration(now - last.time)} old.` : "";
  return `${run}this page asks for new records every second, so the curve moves when one arrives.${age}`;
}

// [step, value] pairs of one event kind in step order, skipping missing values; where a resumed
// run logged a step again, its later record wins (as `scratchlm plot` does).
function lossPoints(records, event, pick) {
  const byStep = new Map();
  for (const r of records) {
    const v = r.event === event && typeof r.step === "number" ? pick(r) : undefined;
    if (typeof v === "number" && Number.isFinite(v)) byStep.set(r.step, v);
  }
  return [...byStep.entries()].sort((a, b) => a[0] - b[0]);
}

// The run's samples, newest first (the newest SAMPLES_SHOWN of them).
function drawSamples(records) {
  const samples = records.filter((r) => r.event === "sample" && typeof r.text === "string");
  const newest = samples.slice(-SAMPLES_SHOWN).reverse();
  const items = newest.map((r) => el("li", { class: "sample" },
    el("div", { class: "sample-step" }, typeof r.step === "number" ? `step ${fmtInt(r.step)}` : "sample"),
    el("pre", {}, r.text)));
  $("#train-sample").replaceChildren(...(items.length ? items : [el("li", { class: "sample" }, "(no sample yet)")]));
  $("#train-samples-note").textContent = !samples.length
    ? "The run has recorded no sample yet (it writes one at each evaluation, or every sample_interval steps)."
    : samples.length > newest.length ? `The ${newest.length} newest of the run's ${samples.length} samples, newest first.`
      : `The run's ${samples.length === 1 ? "sample" : samples.length + " samples, newest first"}.`;
  fontHint(...newest.map((r) => r.text));
}

// ------------------------------------------------------------------ the loss chart

// About `count` round tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten, and
// at least `least` (1 for steps: a tick between two whole steps would repeat a label).
function niceTicks(lo, hi, count, least = 0) {
  const raw = (hi - lo) / count || 1;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = Math.max(least, [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw));
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(+t.toPrecision(12));
  return ticks;
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// The chart's frame at its real width (one SVG unit is one CSS pixel, so 12 px text stays 12 px
// on a phone): {W, H, left, right, top, bottom}; null while the tab is hidden.
function chartFrame(chart) {
  const W = Math.floor(chart.clientWidth);
  if (!W) return null;
  const H = W < 560 ? 260 : 340;
  chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
  return { W, H, left: 52, right: 28, top: 36, bottom: 44 };  // the legend in the top margin
}

// The loss chart: axes with ticks, the train curve, the validation curve, a dot at each point
// (at the first and last train points only where they would crowd), a legend.
function drawChart(chart, trainPoints, valPoints) {
  const f = chartFrame(chart);
  train.width = f ? f.W : 0;
  chart.replaceChildren();
  train.points = [];
  if (!f) return;
  const { W, H, left, right, top, bottom } = f;
  const all = [...trainPoints, ...valPoints];
  if (!all.length) chart.append(svg("text", { x: W / 2, y: H / 2, class: "empty" }, "no loss recorded yet"));
  const steps = all.map((p) => p[0]), losses = all.map((p) => p[1]);
  const x0 = Math.min(0, ...steps), x1 = Math.max(x0 + 1, ...steps);
  let y0 = all.length ? Math.min(...losses) : 0, y1 = all.length ? Math.max(...losses) : 1;
  const pad = (y1 - y0) * 0.08 || 0.5;
  [y0, y1] = [Math.max(0, y0 - pad), y1 + pad];
  const x = (s) => left + ((s - x0) / (x1 - x0)) * (W - left - right);
  const y = (v) => H - bottom - ((v - y0) / (y1 - y0)) * (H - top - bottom);
  chart.append(chartAxes(f, x, y, [x0, x1], [y0, y1]));
  const line = (points, cls) => svg("polyline", { class: cls, "data-points": points.length,
    points: points.map(([s, v]) => `${x(s).toFixed(1)},${y(v).toFixed(1)}`).join(" ") });
  const dot = (cls, [s, v]) => svg("circle", { class: cls, cx: x(s), cy: y(v), r: 3, "data-step": s });
  const crowded = trainPoints.length > (W - left - right) / 8;
  const trainDots = crowded ? [trainPoints[0], trainPoints[trainPoints.length - 1]] : trainPoints;
  chart.append(line(trainPoints, "train-curve"), line(valPoints, "val-curve"),
    ...trainDots.map((p) => dot("train-dot", p)), ...valPoints.map((p) => dot("val-dot", p)),
    chartLegend(left), svg("g", { class: "marks" }));
  train.points = mergedPoints(trainPoints, valPoints, x, y);
  chart.setAttribute("aria-label", `loss by step: ${trainPoints.length} training and ${valPoints.length} ` +
    "validation points; the arrow keys read them");
  if (train.shown !== null) showPoint(train.points.findIndex((p) => p.step === train.shown));
}

// The axes, their ticks and grid lines, and their names.
function chartAxes({ W, H, left, right, top, bottom }, x, y, [x0, x1], [y0, y1]) {
  const axes = svg("g", { class: "axes" });
  axes.append(svg("line", { x1: left, y1: H - bottom, x2: W - right, y2: H - bottom }),
    svg("line", { x1: left, y1: top, x2: left, y2: H - bottom }));
  for (const t of niceTicks(x0, x1, Math.max(2, Math.floor((W - left - right) / 90)), 1)) {
    axes.append(svg("line", { class: "grid", x1: x(t), y1: top, x2: x(t), y2: H - bottom }),
      svg("text", { x: x(t), y: H - bottom + 18, class: "tick-x" }, fmtInt(t)));
  }
  const yTicks = niceTicks(y0, y1, H < 300 ? 4 : 5);
  const decimals = yTicks.length > 1 ? Math.max(0, -Math.floor(Math.log10(yTicks[1] - yTicks[0]) + 1e-9)) : 1;
  for (const t of yTicks) {
    axes.append(svg("line", { class: "grid", x1: left, y1: y(t), x2: W - right, y2: y(t) }),
      svg("text", { x: left - 6, y: y(t) + 4, class: "tick-y" }, t.toFixed(decimals)));
  }
  axes.append(svg("text", { x: (left + W - right) / 2, y: H - 6, class: "axis-label" }, "step"),
    svg("text", { x: 14, y: (top + H - bottom) / 2, class: "axis-label",
      transform: `rotate(-90 14 ${(top + H - bottom) / 2})` }, "loss"));
  return axes;
}

// The legend, in a row above the plot (where a point's values, shown over the plot, never cover it).
function chartLegend(leftEdge) {
  const legend = svg("g", { class: "legend", transform: `translate(${leftEdge}, 18)` });
  [["train-curve", "train loss (mean)"], ["val-curve", "validation loss"]].forEach(([cls, text], k) => {
    legend.append(svg("line", { class: cls, x1: k * 150, y1: 0, x2: k * 150 + 22, y2: 0 }),
      svg("text", { x: k * 150 + 28, y: 4 }, text));
  });
  return legend;
}

// One entry per step that has a train or a validation loss, with where it is drawn.
function mergedPoints(trainPoints, valPoints, x, y) {
  const bySteps = new Map();
  const at = (s) => bySteps.get(s) || bySteps.set(s, { step: s, px: x(s) }).get(s);
  for (const [s, v] of trainPoints) Object.assign(at(s), { train: v, py: y(v) });
  for (const [s, v] of valPoints) Object.assign(at(s), { val: v, vy: y(v) });
  return [...bySteps.values()].sort((a, b) => a.step - b.step);
}

// Show point i's values above the chart, with a mark on it; -1 hides them.
function showPoint(i) {
  const chart = $("#train-chart"), readout = $("#train-readout"), marks = chart.querySelector("g.marks");
  const p = train.points[i];
  if (marks) marks.replaceChildren();
  if (!p) {
    train.shown = null;
    readout.textContent = "";
    return;
  }
  train.shown = p.step;
  const f = chartFrame(chart);
  marks.append(svg("line", { class: "mark-line", x1: p.px, y1: f.top, x2: p.px, y2: f.H - f.bottom }));
  if (p.py !== undefined) marks.append(svg("circle", { class: "mark-dot", cx: p.px, cy: p.py, r: 5 }));
  if (p.vy !== undefined) marks.append(svg("circle", { class: "mark-dot", cx: p.px, cy: p.vy, r: 5 }));
  const parts = [`step ${fmtInt(p.step)}`];
  if (p.train !== undefined) parts.push(`train loss ${p.train.toFixed(3)}`);
  if (p.val !== undefined) parts.push(`validation loss ${p.val.toFixed(3)}`);
  readout.textContent = parts.join(", ");
  readout.dataset.step = p.step;
  // over the plot, below the legend and right of the loss labels, as near the point as fits
  const room = chart.clientLeft + chart.clientWidth - readout.offsetWidth;
  readout.style.left = `${Math.max(f.left, Math.min(room, chart.clientLeft + p.px - readout.offsetWidth / 2))}px`;
  readout.style.top = `${f.top + 4}px`;
}

// The point nearest a pointer's x.
function nearestPoint(chart, clientX) {
  const px = clientX - chart.getBoundingClientRect().left - chart.clientLeft;
  let best = -1;
  train.points.forEach((p, i) => {
    if (best < 0 || Math.abs(p.px - px) < Math.abs(train.points[best].px - px)) best = i;
  });
  return best;
}

// Hover (a mouse), a tap or a drag (touch), and the keys: each shows a point's values.
function setUpChart() {
  const chart = $("#train-chart");
  const index = () => train.points.findIndex((p) => p.step === train.shown);
  chart.addEventListener("pointermove", (e) => showPoint(nearestPoint(chart, e.clientX)));
  chart.addEventListener("pointerdown", (e) => showPoint(nearestPoint(chart, e.clientX)));
  chart.addEventListener("pointerleave", (e) => {
    if (e.pointerType === "mouse" && document.activeElement !== chart) showPoint(-1);
  });
  chart.addEventListener("focus", () => showPoint(index() >= 0 ? index() : train.points.length - 1));
  chart.addEventListener("blur", () => showPoint(-1));
  chart.addEventListener("keydown", (e) => {
    const last = train.points.length - 1, i = index();
    const to = { ArrowLeft: Math.max(0, i - 1), ArrowRight: Math.min(last, i + 1), Home: 0, End: last, Escape: -1 }[e.key];
    if (to === undefined) return;
    e.preventDefault();
    showPoint(to);
  });
  // drawn at its real width: draw again when that changes (a turned phone, the tab shown); in
  // the next frame, since a redraw can change the chart's height within this one
  new ResizeObserver(() => requestAnimationFrame(() => {
    if (Math.floor(chart.clientWidth) !== train.width) drawTraining();
  })).observe(chart);
}
setUpChart();
