// treadle viewer: a tiny line plot on <canvas> (no library). plotLines(canvas, series, opts)
// draws each series (an array of numbers, null = gap) over x = 0..n-1; opts.cursor draws a
// vertical line at that x; opts.stacked draws stacked bars of series (composition).
"use strict";
function plotLines(canvas, series, opts) {
  opts = opts || {};
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 4;
  ctx.clearRect(0, 0, w, h);
  let n = 0, lo = Infinity, hi = -Infinity;
  for (const s of series) {
    n = Math.max(n, s.length);
    for (const v of s) if (v !== null && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }
  if (opts.stacked) { lo = 0; hi = opts.total || 1; }
  if (!isFinite(lo)) { lo = 0; hi = 1; }
  if (hi === lo) { hi = lo + 1; }
  const x = (i) => pad + (n > 1 ? i / (n - 1) : 0.5) * (w - 2 * pad);
  const y = (v) => h - pad - (v - lo) / (hi - lo) * (h - 2 * pad);
  if (opts.stacked) {
    const bw = (w - 2 * pad) / Math.max(1, n);
    for (let i = 0; i < n; i++) {
      let acc = 0;
      series.forEach((s, d) => {
        ctx.fillStyle = `hsl(${d * 137 % 360},55%,55%)`;
        const top = y(acc + s[i]), bottom = y(acc);
        ctx.fillRect(pad + i * bw, top, Math.max(1, bw - 0.5), bottom - top);
        acc += s[i];
      });
    }
  } else {
    series.forEach((s, d) => {
      ctx.strokeStyle = `hsl(${d * 47 % 360},60%,45%)`;
      ctx.beginPath();
      let up = false;
      s.forEach((v, i) => {
        if (v === null || !isFinite(v)) { up = false; return; }
        if (up) ctx.lineTo(x(i), y(v)); else ctx.moveTo(x(i), y(v));
        up = true;
      });
      ctx.stroke();
    });
  }
  if (opts.cursor !== undefined && opts.cursor !== null) {
    ctx.strokeStyle = "#c00";
    ctx.beginPath(); ctx.moveTo(x(opts.cursor), 0); ctx.lineTo(x(opts.cursor), h); ctx.stroke();
  }
  ctx.fillStyle = "#555"; ctx.font = "10px sans-serif";
  if (!opts.stacked) { ctx.fillText(hi.toPrecision(3), 2, 10); ctx.fillText(lo.toPrecision(3), 2, h - 2); }
}
