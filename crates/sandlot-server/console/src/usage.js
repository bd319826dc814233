// CPU and memory of one sandbox over its life, from `GET .../metrics` (a sample
// every 5 s while it is young, coarser as it ages), drawn as two SVG lines. Only
// numbers reach the drawing; labels are text nodes.
import { api, sandboxPath } from './api.js';
import { h, put } from './dom.js';
import { bytes, time } from './format.js';

const NS = 'http://www.w3.org/2000/svg';
const W = 600;
const H = 110;
const PAD = 4;

function svg(tag, attrs) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

/** One chart: `values` (numbers, one per sample) over `at` (ms), scaled to `max`
    (also the operator page's, operator.js). */
export function chart(id, label, at, values, max, describe) {
  const t0 = at[0];
  const span = Math.max(1, at[at.length - 1] - t0);
  const single = at.length === 1; // one point: drawn at the right edge
  const top = max > 0 ? max : 1;
  const points = values.map((v, i) => {
    const x = single ? W - PAD : PAD + ((at[i] - t0) / span) * (W - 2 * PAD);
    const y = H - PAD - (Math.min(v, top) / top) * (H - 2 * PAD);
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  const last = values[values.length - 1];
  const drawing = svg('svg', {
    viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img', class: 'usage-chart',
    'aria-label': `${label}: now ${describe(last)}, at most ${describe(Math.max(...values))}`,
  });
  drawing.append(svg('line', { x1: PAD, y1: H - PAD, x2: W - PAD, y2: H - PAD, class: 'axis' }));
  drawing.append(svg('polyline', { points: points.join(' '), class: 'series' }));
  const [lx, ly] = points[points.length - 1].split(',');
  drawing.append(svg('circle', { cx: lx, cy: ly, r: 3, class: 'now' }));
  return h('figure', { id },
    h('figcaption', {}, `${label}: now ${describe(last)} (scale ${describe(top)})`), drawing);
}

export function usagePanel(id, cleanups, limitBytes) {
  const box = h('div', { id: 'usage' });
  let timer = null;
  let stopped = false;

  async function refresh() {
    clearTimeout(timer);
    try {
      const m = await api('GET', sandboxPath(id, '/metrics'));
      const s = m.samples || [];
      if (!s.length) {
        put(box, h('p', {}, 'No samples: the sandbox does not run.'));
      } else {
        const at = s.map((x) => x.at_unix_ms);
        const cpu = s.map((x) => x.cpu_cores);
        const mem = s.map((x) => x.memory_bytes);
        const cores = (v) => `${v.toFixed(2)} cores`;
        put(box,
          chart('usage-cpu', 'CPU', at, cpu, Math.max(1, ...cpu), cores),
          chart('usage-memory', 'Memory', at, mem, Math.max(limitBytes(), ...mem), bytes),
          h('p', { class: 'muted' }, s.length === 1
            ? `one sample, ${time(s[0].at)}; then one every ${m.interval_seconds} s`
            : `${s.length} samples from ${time(s[0].at)}, one every ${m.interval_seconds} s`));
      }
    } catch (err) {
      put(box, h('p', { class: 'error' }, `Usage: ${err.message}`));
    }
    if (!stopped) timer = setTimeout(refresh, 5000);
  }
  cleanups.push(() => { stopped = true; clearTimeout(timer); });
  refresh();
  return h('section', { 'aria-labelledby': 'usage-h' }, h('h2', { id: 'usage-h' }, 'CPU and memory'), box);
}
