// One sandbox: its spec and state, a terminal, its CPU and memory over time, its
// processes, its files, its network policy and egress log, its published ports.
import { api, sandboxPath } from './api.js';
import { h, put, refill, table, toast, field } from './dom.js';
import { bytes, duration, since, until, time, tagsText } from './format.js';
import { openTerminal } from './terminal.js';
import { filesPanel } from './files.js';
import { networkPanel } from './network.js';
import { usagePanel } from './usage.js';
import { processesPanel } from './processes.js';

export function sandboxPage(main, id) {
  const cleanups = [];
  let stopped = false;
  let timer = null;
  const head = h('div', { class: 'bar' });
  const spec = h('div', { id: 'spec' });
  const record = h('pre', {});
  const termBox = h('div', { class: 'terminal', id: 'terminal' });
  const termBar = h('div', { class: 'bar' });
  const ports = h('div', { id: 'ports' });
  let term = null;
  let connected = false;
  let memoryLimit = 0;
  let state = '';

  function summary(sb) {
    const s = sb.spec || {};
    const res = s.resources || {};
    memoryLimit = Number(res.memory) || 0;
    state = sb.state;
    const rows = [
      ['State', sb.state], ['Image', s.image || 'host'], ['Isolation', s.isolation || 'namespace'],
      ['Tenant', sb.tenant], ['Created', time(sb.created_at)], ['Age', duration(since(sb.created_at))],
      ['Lifetime left', sb.state === 'running' ? duration(until(sb.expires_at)) : ''],
      ['CPUs', res.cpus ?? ''], ['Memory limit', bytes(res.memory)],
      ['Memory used', sb.usage ? bytes(sb.usage.memory_bytes) : ''],
      ['CPU time', sb.usage ? `${sb.usage.cpu_seconds.toFixed(2)}s` : ''],
      ['Network', (s.network || {}).mode || ''], ['User', s.user || ''],
      ['Tags', tagsText(sb.tags).join(', ')], ['End reason', sb.end_reason || ''], ['Error', sb.error || ''],
    ];
    put(record, JSON.stringify(sb, null, 2));
    return h('dl', { class: 'spec' }, rows.filter(([, v]) => v !== '').map(([k, v]) => [h('dt', {}, k), h('dd', {}, String(v))]));
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const sb = await api('GET', sandboxPath(id));
      refill(head, h('h1', {}, sb.name ? `${sb.name} (${sb.id})` : sb.id),
        h('span', { class: `state ${sb.state}` }, sb.state), actions(sb));
      put(spec, summary(sb));
      refill(termBar, h('h2', {}, 'Terminal'), sb.state === 'running' && !connected
        ? h('button', { type: 'button', id: 'open-terminal', onclick: startTerminal }, term ? 'Reconnect' : 'Open terminal')
        : null);
      if (sb.state === 'stopped') stopped = true;
    } catch (err) {
      put(head, h('h1', {}, id), h('p', { class: 'error' }, err.status === 404 ? 'No such sandbox.' : err.message));
      stopped = true;
    }
    if (!stopped) timer = setTimeout(refresh, 3000);
  }

  function startTerminal() {
    if (term) term.close();
    connected = true;
    term = openTerminal(termBox, id, () => {
      connected = false;
      if (!stopped) refresh();
    });
    refresh();
  }
  cleanups.push(() => { if (term) term.close(); });

  function actions(sb) {
    const btn = (label, fn, cls) => h('button', { type: 'button', class: cls, onclick: fn }, label);
    const out = [];
    if (sb.state === 'running') {
      out.push(btn('+5m', () => act('extend', sb)), btn('Pause', () => act('pause', sb)));
    }
    if (sb.state === 'paused') out.push(btn('Resume', () => act('resume', sb)));
    if (sb.state !== 'stopped') out.push(btn('Delete', () => act('delete', sb), 'danger'));
    return h('span', { class: 'actions' }, out);
  }

  async function act(what, sb) {
    try {
      if (what === 'delete') {
        if (!window.confirm(`Delete sandbox ${sb.id}? Its processes and files are gone for good.`)) return;
        await api('DELETE', sandboxPath(id));
        location.hash = '#/';
        return;
      }
      if (what === 'extend') {
        const left = Math.max(0, until(sb.expires_at) || 0);
        await api('POST', sandboxPath(id, '/timeout'), { json: { timeout: Math.round(left + 300) } });
      } else {
        await api('POST', sandboxPath(id, `/${what}`));
      }
      toast(`${what}: done`);
    } catch (err) {
      toast(`${what}: ${err.message}`, 'error');
    }
    refresh();
  }

  async function loadPorts() {
    try {
      const list = (await api('GET', sandboxPath(id, '/ports'))).ports;
      put(ports, table('Published ports', ['Port', 'Address', 'Since', ''], list.map((p) => ({
        cells: [String(p.port), p.address, time(p.created_at),
          h('button', { type: 'button', onclick: async () => {
            try { await api('DELETE', sandboxPath(id, `/ports/${p.port}`)); } catch (err) { toast(err.message, 'error'); }
            loadPorts();
          } }, 'Unpublish')],
      })), 'No published ports.'));
    } catch (err) {
      put(ports, h('p', { class: 'error' }, `Ports: ${err.message}`));
    }
  }
  const portInput = h('input', { inputmode: 'numeric', name: 'port', size: 6 });
  const publish = h('form', { class: 'inline', onsubmit: async (e) => {
    e.preventDefault();
    try {
      await api('POST', sandboxPath(id, '/ports'), { json: { port: Number(portInput.value) } });
      portInput.value = '';
    } catch (err) { toast(`publish: ${err.message}`, 'error'); }
    loadPorts();
  } }, field('Sandbox port', portInput), h('button', { type: 'submit' }, 'Publish'));

  put(main,
    h('p', {}, h('a', { href: '#/' }, '← Sandboxes')),
    head,
    h('section', { 'aria-label': 'Spec' }, spec,
      h('details', {}, h('summary', {}, 'Full record (JSON)'), record)),
    h('section', { 'aria-label': 'Terminal' }, termBar, termBox),
    usagePanel(id, cleanups, () => memoryLimit),
    processesPanel(id, cleanups, () => state),
    filesPanel(id, cleanups),
    networkPanel(id, cleanups),
    h('section', { 'aria-labelledby': 'ports-h' }, h('h2', { id: 'ports-h' }, 'Published ports'), publish, ports));
  refresh();
  loadPorts();
  return () => { stopped = true; clearTimeout(timer); cleanups.forEach((f) => f()); };
}
