// Tab 4, Training: while the tab is shown, ask GET /api/training every second for the run's
// new metrics records, and draw the loss curves (SVG), the speed and the latest sample.
"use strict";

const train = { active: false, epoch: 0, timer: null };

function trainingShown(runChanged) {
  if (runChanged) resetTraining();
  startPolling();
}

// A new model: start again from its first record.
function resetTraining() {
  stopPolling();
  playground.training = { records: [], next: 0, training: false, skipped: 0 };
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
    state.polled = true;
    if (changed) drawTraining();
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

// The figures, the chart and the latest sample.
function drawTraining() {
  const { records, training, skipped } = playground.training;
  const lastTrain = latest(records, "train", "tokens_per_s");
  const lastStep = [...records].reverse().find((r) => typeof r.step === "number");
  $("#train-tps").textContent = lastTrain ? `${fmtInt(lastTrain.tokens_per_s)} tokens/s` : "–";
  $("#train-step").textContent = lastStep ? fmtInt(lastStep.step) : "–";
  const last = records[records.length - 1];
  const lastText = last ? `${last.event}${typeof last.step === "number" ? " at step " + last.step : ""}` : "none";
  const skippedText = skipped ? `; ${skipped} line${skipped === 1 ? "" : "s"} of the log skipped (too long or not JSON)` : "";
  $("#train-status").textContent = (training ? "training now" : `not training (last record: ${lastText})`) + skippedText;
  $("#train-status").dataset.skipped = skipped || 0;
  $("#train-status").dataset.training = training;
  const trainPoints = lossPoints(records, "train", (r) => r.loss_mean ?? r.loss);
  const valPoints = lossPoints(records, "eval", (r) => r.val_loss);
  const lastOf = (points) => (points.length ? points[points.length - 1][1].toFixed(3) : "–");
  $("#train-loss").textContent = `${lastOf(trainPoints)} / ${lastOf(valPoints)}`;
  drawChart($("#train-chart"), trainPoints, valPoints);
  const sample = latest(records, "sample", null);
  $("#train-sample").textContent = sample ? `step ${sample.step}:\n${sample.text}` : "(no sample yet)";
}

// [step, value] pairs of one event kind, in step order, skipping missing values.
function lossPoints(records, event, pick) {
  return records.filter((r) => r.event === event && typeof r.step === "number")
    .map((r) => [r.step, pick(r)])
    .filter(([, v]) => typeof v === "number" && Number.isFinite(v))
    .sort((a, b) => a[0] - b[0]);
}

// About `count` round tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten.
function niceTicks(lo, hi, count) {
  const raw = (hi - lo) / count || 1;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
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

// The loss chart: axes with ticks, the train curve, the validation curve, a legend.
function drawChart(chart, trainPoints, valPoints) {
  const W = 800, H = 340, left = 52, right = 16, top = 16, bottom = 40;
  const all = [...trainPoints, ...valPoints];
  chart.replaceChildren();
  if (!all.length) chart.append(svg("text", { x: W / 2, y: H / 2, class: "empty" }, "no loss recorded yet"));
  const steps = all.map((p) => p[0]), losses = all.map((p) => p[1]);
  const x0 = Math.min(0, ...steps), x1 = Math.max(x0 + 1, ...steps);
  let y0 = all.length ? Math.min(...losses) : 0, y1 = all.length ? Math.max(...losses) : 1;
  const pad = (y1 - y0) * 0.08 || 0.5;
  y0 = Math.max(0, y0 - pad);
  y1 += pad;
  const x = (s) => left + ((s - x0) / (x1 - x0)) * (W - left - right);
  const y = (v) => H - bottom - ((v - y0) / (y1 - y0)) * (H - top - bottom);
  const axes = svg("g", { class: "axes" });
  axes.append(svg("line", { x1: left, y1: H - bottom, x2: W - right, y2: H - bottom }),
    svg("line", { x1: left, y1: top, x2: left, y2: H - bottom }));
  for (const t of niceTicks(x0, x1, 6)) {
    axes.append(svg("line", { class: "grid", x1: x(t), y1: top, x2: x(t), y2: H - bottom }),
      svg("text", { x: x(t), y: H - bottom + 16, class: "tick-x" }, fmtInt(t)));
  }
  for (const t of niceTicks(y0, y1, 5)) {
    axes.append(svg("line", { class: "grid", x1: left, y1: y(t), x2: W - right, y2: y(t) }),
      svg("text", { x: left - 6, y: y(t) + 4, class: "tick-y" }, String(t)));
  }
  axes.append(svg("text", { x: (left + W - right) / 2, y: H - 6, class: "axis-label" }, "step"),
    svg("text", { x: 14, y: (top + H - bottom) / 2, class: "axis-label",
      transform: `rotate(-90 14 ${(top + H - bottom) / 2})` }, "loss"));
  const line = (points, cls) => svg("polyline", { class: cls, "data-points": points.length,
    points: points.map(([s, v]) => `${x(s).toFixed(1)},${y(v).toFixed(1)}`).join(" ") });
  const dots = valPoints.map(([s, v]) => svg("circle", { class: "val-dot", cx: x(s), cy: y(v), r: 3 }));
  chart.append(axes, line(trainPoints, "train-curve"), line(valPoints, "val-curve"), ...dots, chartLegend(W - right));
}

function chartLegend(rightEdge) {
  const legend = svg("g", { class: "legend", transform: `translate(${rightEdge - 150}, 22)` });
  [["train-curve", "train loss (mean)"], ["val-curve", "validation loss"]].forEach(([cls, text], k) => {
    legend.append(svg("line", { class: cls, x1: 0, y1: k * 18, x2: 22, y2: k * 18 }),
      svg("text", { x: 28, y: k * 18 + 4 }, text));
  });
  return legend;
}

