// treadle viewer: the parts of pages that load after the HTML (so a slow store shows
// "loading…", never a blank page): the paged episode list, table.stats on demand, the
// episode player (videos in sync, image columns frame by frame, plots with a cursor, values
// and frame under the cursor),
// and a run's composition plot.
"use strict";
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
async function getJSON(src, method) {
  const r = await fetch(src, { credentials: "same-origin", method: method || "GET" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
function showError(box, err) { box.replaceChildren(el("p", { class: "error" }, String(err.message || err))); }

async function episodeList(box, offset, filter) {
  filter = filter || "";
  box.replaceChildren(el("p", { class: "muted" }, "loading…"));
  try {
    const page = await getJSON(`${box.dataset.src}?offset=${offset}&limit=100&filter=${encodeURIComponent(filter)}`);
    const t = el("table", { id: "episode-list" });
    t.append(el("thead")); t.tHead.append(el("tr"));
    for (const h of ["#", "episode", "first moment", "frames"]) t.tHead.rows[0].append(el("th", {}, h));
    const body = el("tbody"); t.append(body);
    for (const e of page.episodes) {
      const tr = el("tr"); const a = el("a", { href: e.href }, e.name);
      tr.append(el("td", {}, String(e.index)), el("td"), el("td", {}, String(e.start)), el("td", {}, String(e.length)));
      tr.cells[1].append(a); body.append(tr);
    }
    const last = Math.min(page.total, page.offset + page.episodes.length);
    const info = el("p", { class: "pager", id: "episode-pager" });
    const prev = el("button", { type: "button" }, "← previous"), next = el("button", { type: "button" }, "next →");
    prev.disabled = page.offset === 0; next.disabled = last >= page.total;
    prev.onclick = () => episodeList(box, Math.max(0, page.offset - 100), filter);
    next.onclick = () => episodeList(box, page.offset + 100, filter);
    const jump = el("input", { type: "number", id: "episode-jump", min: "1", max: String(Math.max(1, page.total)), placeholder: "go to #" });
    jump.onchange = () => episodeList(box, Math.max(0, Math.min(page.total - 1, (parseInt(jump.value) || 1) - 1)), filter);
    const find = el("input", { type: "search", id: "episode-filter", placeholder: "filter names" });
    find.value = filter;
    find.onchange = () => episodeList(box, 0, find.value);
    const span = page.total ? `episodes ${page.offset + 1}–${last} of ${page.total}` : "no episodes";
    info.append(prev, next, span + (filter ? ` matching “${filter}”` : ""), " ", jump, " ", find);
    box.replaceChildren(info, t);
  } catch (err) { showError(box, err); }
}

function fmt(v) {
  if (v === null) return "–";
  if (Array.isArray(v)) return v.length > 8 ? `[${v.slice(0, 8).map(fmt).join(", ")}, … ${v.length} values]` : `[${v.map(fmt).join(", ")}]`;
  return typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : String(v);
}
async function computeStats(box) {
  box.replaceChildren(el("p", { class: "muted" }, "computing table.stats…"));
  try {
    const stats = await getJSON(box.dataset.src, "POST");
    const fields = [];
    for (const s of Object.values(stats)) for (const k of Object.keys(s || {})) if (!fields.includes(k)) fields.push(k);
    const t = el("table", { id: "stats-result" }), head = el("tr");
    for (const h of ["column", ...fields]) head.append(el("th", {}, h));
    t.append(el("thead")); t.tHead.append(head);
    const body = el("tbody"); t.append(body);
    for (const [name, s] of Object.entries(stats)) {
      const tr = el("tr"); tr.append(el("td", {}, name));
      for (const k of fields) tr.append(el("td", { class: "num" }, fmt((s || {})[k] ?? null)));
      body.append(tr);
    }
    box.replaceChildren(t);
  } catch (err) { showError(box, err); }
}

async function episodePlayer(box) {
  const fps = parseFloat(box.dataset.fps), frames = parseInt(box.dataset.frames);
  const videos = Array.from(box.querySelectorAll("video"));
  const scrub = document.getElementById("scrub"), label = document.getElementById("cursor-frame");
  const plots = document.getElementById("plots"), values = document.getElementById("values");
  let data = null, canvases = [];
  const frameAt = (t) => Math.min(frames - 1, Math.max(0, Math.floor(t * fps + 1e-3)));
  function draw(f) {
    label.textContent = String(f); scrub.value = String(f);
    if (!data) return;
    canvases.forEach(([c, name]) => plotLines(c, data.series[name], { cursor: f }));
    // data.json holds the first data.shown frames (a bound on what one page reads)
    if (f >= data.shown && Object.keys(data.series).length) { values.textContent = `frame ${f}: the plots hold frames 0–${data.shown - 1} only`; return; }
    const rows = Object.entries(data.series).map(([name, s]) => `${name}: [${s.map((d) => d[f] === null ? "null" : d[f].toPrecision(4)).join(", ")}]`);
    values.textContent = rows.join("  ·  ");
  }
  const query = box.dataset.query || "";
  const cameras = Array.from(box.querySelectorAll("img.camera"));
  let shown = -1, timer = null;
  function frameSrc(img, f) {
    const q = img.dataset.stretch === "1" ? `${query}${query ? "&" : "?"}stretch=1` : query;
    return `${box.dataset.base}/frame/${img.dataset.column}/${f}.png${q}`;
  }
  function under(f) {
    if (f === shown) return;
    shown = f;
    box.querySelectorAll("img.under").forEach((img) => { img.src = frameSrc(img, f); });
  }
  function seek(f) {
    f = Math.min(frames - 1, Math.max(0, f));
    for (const v of videos) v.currentTime = (f + 0.5) / fps;
    draw(f); under(f);
  }
  const lead = videos[0];
  if (lead) {
    lead.addEventListener("timeupdate", () => {
      const f = frameAt(lead.currentTime); draw(f); under(f);
      for (const v of videos.slice(1)) if (Math.abs(v.currentTime - lead.currentTime) > 0.5 / fps) v.currentTime = lead.currentTime;
    });
    lead.addEventListener("pause", () => under(frameAt(lead.currentTime)));
  }
  const play = document.getElementById("play");
  function stop() {
    if (timer) { clearInterval(timer); timer = null; }
    videos.forEach((v) => v.pause());
    if (play) play.textContent = "play";
  }
  // No video: image columns play frame by frame, each frame shown once every camera's
  // image of the frame before has loaded (as fast as the server decodes, at most at fps).
  function tick() {
    if (cameras.some((img) => !img.complete)) return;
    const f = parseInt(scrub.value) + 1;
    if (f >= frames) { stop(); return; }
    draw(f); under(f);
  }
  if (play) play.onclick = () => {
    if (lead) {
      if (lead.paused) videos.forEach((v) => v.play()); else videos.forEach((v) => v.pause());
    } else if (timer) stop();
    else if (cameras.length) { timer = setInterval(tick, 1000 / fps); play.textContent = "pause"; }
  };
  const step = (d) => () => { stop(); seek(parseInt(scrub.value) + d); };
  for (const [id, d] of [["prev-frame", -1], ["next-frame", 1]]) {
    const b = document.getElementById(id);
    if (b) b.onclick = step(d);
  }
  scrub.oninput = () => { stop(); seek(parseInt(scrub.value)); };
  try {
    data = await getJSON(box.dataset.src);
    plots.replaceChildren();
    if (data.shown < data.frames && Object.keys(data.series).length) {
      plots.append(el("p", { class: "muted", id: "plots-shown" }, `plots of frames 0–${data.shown - 1} of ${data.frames} (the first ${data.shown}: a page reads at most so many values)`));
    }
    for (const [name, series] of Object.entries(data.series)) {
      const fig = el("figure"), c = el("canvas", { class: "plot", width: "640", height: "120", "data-column": name });
      const bad = (data.nonfinite || {})[name];
      const note = bad ? ` · ${bad} NaN or infinite values, drawn as gaps` : "";
      fig.append(el("figcaption", { class: bad ? "nonfinite" : "" }, `${name} (${data.dims[name]} dims)${note}`), c); plots.append(fig);
      canvases.push([c, name]);
    }
    const tasks = document.getElementById("tasks");
    for (const [name, list] of Object.entries(data.tasks)) {
      // each value isolated: a right-to-left override in one cannot reorder the others
      const p = el("p", { class: "task" }, `${name}: `);
      list.forEach((v, i) => { if (i) p.append(" | "); p.append(el("bdi", {}, v)); });
      tasks.append(p);
    }
  } catch (err) { showError(plots, err); }
  seek(parseInt(box.dataset.frame) || 0);
}

async function composition(box) {
  try {
    const data = await getJSON(`${box.dataset.src}?start=0&count=200`);
    const names = box.dataset.names.split(",");
    const series = names.map((_, d) => data.counts.map((row) => row[d]));
    const c = el("canvas", { class: "plot", width: "800", height: "120", id: "composition-plot" });
    const legend = el("p", {}, names.map((n, d) => `${n}: ${series[d].reduce((a, b) => a + b, 0)} samples`).join(" · ") + ` in steps ${data.start}–${data.start + data.counts.length - 1}`);
    box.replaceChildren(c, legend);
    plotLines(c, series, { stacked: true, total: data.batch_size });
  } catch (err) { showError(box, err); }
}

async function stepSamples(box) {
  try {
    const r = await fetch(box.dataset.src, { credentials: "same-origin" });
    const text = await r.text();
    if (!r.ok) {
      const doc = new DOMParser().parseFromString(text, "text/html");
      const msg = doc.querySelector(".error");
      throw new Error(msg ? msg.textContent : r.statusText);
    }
    box.innerHTML = text;  // the server's own HTML: every name in it is escaped there
    box.querySelectorAll("button.more").forEach((b) => { b.onclick = () => moreFrames(b); });
  } catch (err) { showError(box, err); }
}

async function moreFrames(button) {
  button.disabled = true; button.textContent = "loading…";
  try {
    const r = await fetch(button.dataset.src, { credentials: "same-origin" });
    const text = await r.text();
    if (!r.ok) throw new Error(r.statusText);
    const div = el("div", { class: "all-frames" }); div.innerHTML = text;  // escaped by the server
    button.replaceWith(div);
  } catch (err) { button.textContent = String(err.message || err); }
}

document.addEventListener("DOMContentLoaded", () => {
  const eps = document.getElementById("episodes");
  if (eps) episodeList(eps, 0);
  const stats = document.getElementById("stats"), button = document.getElementById("compute-stats");
  if (stats && button) button.onclick = () => computeStats(stats);
  const ep = document.getElementById("episode");
  if (ep) episodePlayer(ep);
  const comp = document.getElementById("composition");
  if (comp) composition(comp);
  const stepBox = document.getElementById("step");
  if (stepBox) stepSamples(stepBox);
});
