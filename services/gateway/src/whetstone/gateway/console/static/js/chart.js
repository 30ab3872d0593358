// A small SVG line chart of training and validation loss per step, redrawn as points arrive.
import { svg, clear } from "./dom.js";

const W = 720, H = 260, PAD = { left: 56, right: 16, top: 14, bottom: 34 };

export class LossChart {
  constructor() {
    this.train = new Map();   // step -> loss
    this.valid = new Map();   // step -> validation loss
    this.el = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img",
                           "aria-label": "Loss per step: no points yet", "data-points": "0" });
    this.pending = false;
    this.draw();
  }

  add(step, loss, validationLoss) {
    if (typeof step !== "number") return;
    if (typeof loss === "number" && Number.isFinite(loss)) this.train.set(step, loss);
    if (typeof validationLoss === "number" && Number.isFinite(validationLoss)) this.valid.set(step, validationLoss);
    if (!this.pending) {   // many events in one burst: one redraw per frame
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.draw(); });
    }
  }

  draw() {
    const el = clear(this.el);
    const series = [[this.train, "train"], [this.valid, "valid"]].map(([m, c]) => [[...m.entries()].sort((a, b) => a[0] - b[0]), c]);
    const all = series.flatMap(([pts]) => pts);
    el.setAttribute("data-points", String(this.train.size));
    el.setAttribute("data-validation-points", String(this.valid.size));
    if (!all.length) {
      el.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "waiting for the first training step…"));
      return;
    }
    const steps = all.map((p) => p[0]), losses = all.map((p) => p[1]);
    const x0 = Math.min(...steps), x1 = Math.max(...steps, x0 + 1);
    let y0 = Math.min(...losses), y1 = Math.max(...losses);
    if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
    const X = (s) => PAD.left + ((s - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
    const Y = (v) => H - PAD.bottom - ((v - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
    el.append(
      svg("line", { class: "axis", x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom }),
      svg("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom }),
      svg("text", { x: PAD.left - 6, y: Y(y1) + 4, "text-anchor": "end" }, y1.toPrecision(3)),
      svg("text", { x: PAD.left - 6, y: Y(y0) + 4, "text-anchor": "end" }, y0.toPrecision(3)),
      svg("text", { x: X(x0), y: H - PAD.bottom + 16, "text-anchor": "middle" }, String(x0)),
      svg("text", { x: X(x1), y: H - PAD.bottom + 16, "text-anchor": "middle" }, String(x1)),
      svg("text", { x: (W + PAD.left) / 2, y: H - 4, "text-anchor": "middle" }, "step"));
    for (const [pts, cls] of series) {
      if (!pts.length) continue;
      el.append(svg("polyline", { class: cls, fill: "none", "stroke-width": 2,
                                  points: pts.map(([s, v]) => `${X(s).toFixed(1)},${Y(v).toFixed(1)}`).join(" ") }));
      if (pts.length === 1) el.append(svg("circle", { class: cls, cx: X(pts[0][0]), cy: Y(pts[0][1]), r: 3, fill: "currentColor" }));
    }
    const last = series[0][0].at(-1);
    el.setAttribute("aria-label", `Loss per step: ${this.train.size} training points, ${this.valid.size} validation points` +
                    (last ? `; latest step ${last[0]}, loss ${last[1].toPrecision(4)}` : ""));
  }
}
