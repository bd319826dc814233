// The network policy and the egress audit log, with a filter.
import { api, sandboxPath } from './api.js';
import { h, put, refill, table } from './dom.js';
import { bytes, time } from './format.js';

export function networkPanel(id, cleanups) {
  const policy = h('pre', { id: 'policy' });
  const log = h('div', { id: 'egress-log' });
  const filter = h('input', { type: 'search', placeholder: 'host, address, reason…', 'aria-label': 'Filter the egress log' });
  const decision = h('select', { 'aria-label': 'Decision' },
    h('option', { value: '' }, 'any decision'), h('option', { value: 'allowed' }, 'allowed'),
    h('option', { value: 'denied' }, 'denied'), h('option', { value: 'failed' }, 'failed'));
  let entries = [];
  let timer = null;
  let stopped = false;

  function render() {
    const q = filter.value.trim().toLowerCase();
    const rows = entries.filter((e) => (!decision.value || e.decision === decision.value)
      && (!q || [e.name, e.addr, e.port, e.kind, e.reason, e.decision].join(' ').toLowerCase().includes(q)))
      .slice().reverse().map((e) => ({
        attrs: { class: `decision-${e.decision}` },
        cells: [time(e.at), e.kind, e.name || '', e.addr || '', e.port ?? '', e.decision, e.reason || '',
          `${bytes(e.bytes_out)} / ${bytes(e.bytes_in)}`],
      }));
    refill(log, table('Egress log', ['At', 'Kind', 'Host', 'Address', 'Port', 'Decision', 'Reason', 'Out / in'],
      rows, entries.length ? 'No entry matches the filter.' : 'No egress yet.'));
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      put(policy, JSON.stringify(await api('GET', sandboxPath(id, '/network')), null, 2));
      const after = entries.length ? entries[entries.length - 1].seq : undefined;
      const more = (await api('GET', sandboxPath(id, '/network/log'), { query: { after, limit: 500 } })).entries;
      entries = entries.concat(more).slice(-2000);
      render();
    } catch (err) {
      put(log, h('p', { class: 'error' }, `Egress log: ${err.message}`));
    }
    if (!stopped) timer = setTimeout(refresh, 3000);
  }
  filter.addEventListener('input', render);
  decision.addEventListener('change', render);
  cleanups.push(() => { stopped = true; clearTimeout(timer); });
  refresh();
  return h('section', { 'aria-labelledby': 'net-h' },
    h('h2', { id: 'net-h' }, 'Network'),
    h('details', {}, h('summary', {}, 'Policy'), policy),
    h('div', { class: 'bar' }, h('h3', {}, 'Egress log'), filter, decision),
    log);
}
