// Placeholder for the long input's head detail (the zooming one, which fetches windows, replaces it): one
// head's overview blocks (every head pooled to 128 x 128 blocks, max) as a Plotly heatmap over the
// input's token coordinates [0, n) x [0, n), with the interface the page wires:
//   new LongDetail(gd, { readout }); show({ query, trace, layer, head, signal }); clear()

import { COLORSCALE } from "./colors.js";
import { fetchOverview } from "./trace-api.js";

export class LongDetail {
  constructor(gd, { readout }) {
    this.gd = gd;
    this.readout = readout;
    this.overview = null; // {key, attention promise} of the trace last shown: fetched once per trace
  }

  async show({ query, trace, layer, head, signal }) {
    const key = JSON.stringify([trace.model, query.text, query.pair, query.chat]);
    // Per run too: an overview fetch the old run aborted must not stand for the same text run again.
    if (this.overview?.key !== key || this.overview.signal !== signal) {
      this.overview = { key, signal, attention: fetchOverview(query, { signal }) };
    }
    const attention = await this.overview.attention;
    if (signal?.aborted) return;
    const { edges, reduce } = attention.header;
    const s = attention.n;
    const block = attention.headInto(layer, head);
    const z = Array.from({ length: s }, (_, r) => Array.from(block.subarray(r * s, (r + 1) * s)));
    const centres = Array.from({ length: s }, (_, b) => (edges[b] + edges[b + 1] - 1) / 2);
    const k = Math.max(...centres.map((_, b) => edges[b + 1] - edges[b]));
    const axis = (title) => ({ title: { text: k > 1 ? `${title} · pooled ×${k} (${reduce})` : title } });
    const data = [{ type: "heatmap", z, x: centres, y: centres, colorscale: COLORSCALE, zmin: 0, zmax: 1 }];
    const layout = {
      title: { text: `L${layer} H${head} of ${trace.n} tokens` },
      xaxis: axis("key token"),
      yaxis: { ...axis("query token"), autorange: "reversed" },
      margin: { t: 40, l: 70, r: 20, b: 60 },
      height: 460,
    };
    await window.Plotly.react(this.gd, data, layout, { displaylogo: false, responsive: true, showTips: false });
    this.gd.dataset.state = "ready";
    this.readout.textContent = `Layer ${layer}, head ${head}: ${s} × ${s} blocks of up to ${k} tokens (${reduce}).`;
  }

  clear() {
    this.overview = null;
    window.Plotly.purge(this.gd);
    delete this.gd.dataset.state;
    this.readout.textContent = "";
  }
}
