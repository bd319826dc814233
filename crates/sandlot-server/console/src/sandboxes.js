// The sandboxes: a live table with a filter, the create form, and the actions
// (extend, pause, resume, delete).
import { api, sandboxPath } from './api.js';
import { h, put, refill, table, field, toast } from './dom.js';
import { bytes, duration, since, until, tagsText } from './format.js';

const REFRESH_MS = 2000;

/** Renders the page into `main`; answers its clean-up. */
export function sandboxesPage(main) {
  let timer = null;
  let stopped = false;
  const lastCpu = new Map(); // id -> [cpu_seconds, time]: CPU use between refreshes
  const filter = h('input', { type: 'search', placeholder: 'id, name, image, state, tag…', 'aria-label': 'Filter sandboxes' });
  const states = h('select', { 'aria-label': 'States' },
    h('option', { value: 'live' }, 'live'), h('option', { value: 'all' }, 'all'),
    h('option', { value: 'paused' }, 'paused'));
  const list = h('div', { id: 'sandbox-list', 'aria-live': 'off' });
  let current = [];

  filter.addEventListener('input', () => render());
  states.addEventListener('change', () => refresh());

  function matches(sb, q) {
    if (!q) return true;
    const hay = [sb.id, sb.name, sb.state, sb.spec.image || 'host', sb.spec.isolation || 'namespace',
      ...tagsText(sb.tags)].join(' ').toLowerCase();
    return q.toLowerCase().split(/\s+/).every((w) => hay.includes(w));
  }

  function cpuText(sb) {
    const u = sb.usage || {};
    const prev = lastCpu.get(sb.id);
    const now = Date.now();
    let pct = '';
    if (prev && now > prev[1] && u.cpu_seconds !== undefined) {
      pct = ` (${Math.max(0, ((u.cpu_seconds - prev[0]) / ((now - prev[1]) / 1000)) * 100).toFixed(0)}%)`;
    }
    if (u.cpu_seconds !== undefined) lastCpu.set(sb.id, [u.cpu_seconds, now]);
    return u.cpu_seconds === undefined ? '' : `${u.cpu_seconds.toFixed(2)}s${pct}`;
  }

  function actions(sb) {
    const btn = (label, fn, cls) => h('button', { type: 'button', class: cls, onclick: fn }, label);
    const out = [];
    if (sb.state === 'running') {
      out.push(btn('+5m', () => act(sb, 'extend')));
      out.push(btn('Pause', () => act(sb, 'pause')));
    }
    if (sb.state === 'paused') out.push(btn('Resume', () => act(sb, 'resume')));
    if (sb.state !== 'stopped') out.push(btn('Delete', () => act(sb, 'delete'), 'danger'));
    return h('span', { class: 'actions' }, out);
  }

  function render() {
    const q = filter.value.trim();
    const rows = current.filter((sb) => matches(sb, q)).map((sb) => ({
      attrs: { 'data-id': sb.id },
      cells: [
        h('a', { href: `#/sandboxes/${encodeURIComponent(sb.id)}` }, sb.name ? `${sb.name} (${sb.id})` : sb.id),
        h('span', { class: `state ${sb.state}` }, sb.state),
        sb.spec.image || 'host',
        sb.spec.isolation || 'namespace',
        duration(since(sb.created_at)),
        sb.state === 'running' ? duration(until(sb.expires_at)) : '',
        cpuText(sb),
        sb.usage ? bytes(sb.usage.memory_bytes) : '',
        h('span', { class: 'tags' }, tagsText(sb.tags).map((t) => h('span', { class: 'tag' }, t))),
        actions(sb),
      ],
    }));
    refill(list, table('Sandboxes',
      ['Sandbox', 'State', 'Image', 'Isolation', 'Age', 'Left', 'CPU', 'Memory', 'Tags', ''],
      rows, current.length ? 'No sandbox matches the filter.' : 'No sandboxes.'));
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      current = (await api('GET', '/v1/sandboxes', { query: { state: states.value, limit: 200 } })).sandboxes;
      render();
    } catch (err) {
      put(list, h('p', { class: 'error' }, `Could not list sandboxes: ${err.message}`));
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
  }

  async function act(sb, what) {
    try {
      if (what === 'delete') {
        if (!window.confirm(`Delete sandbox ${sb.id}? Its processes and files are gone for good.`)) return;
        await api('DELETE', sandboxPath(sb.id));
      } else if (what === 'extend') {
        const left = Math.max(0, until(sb.expires_at) || 0);
        await api('POST', sandboxPath(sb.id, '/timeout'), { json: { timeout: Math.round(left + 300) } });
      } else {
        await api('POST', sandboxPath(sb.id, `/${what}`));
      }
      toast(`${what}: ${sb.id} done`);
    } catch (err) {
      toast(`${what} ${sb.id}: ${err.message}`, 'error');
    }
    refresh();
  }

  put(main,
    h('section', { 'aria-labelledby': 'sb-h' },
      h('div', { class: 'bar' }, h('h1', { id: 'sb-h' }, 'Sandboxes'), filter, states),
      list),
    createForm(refresh));
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}

/** `domain[:port,port]` or `cidr[:port]` per line → allow rules. */
export function allowRules(text) {
  return text.split('\n').map((l) => l.trim()).filter(Boolean).map((line) => {
    const [target, ports] = line.split(/\s+|:(?=[\d,]+$)/);
    const rule = /^[\d.]+(\/\d+)?$|:/.test(target) ? { cidr: target } : { domain: target };
    if (ports) rule.ports = ports.split(',').map(Number);
    return rule;
  });
}

function createForm(done) {
  const image = h('input', { name: 'image', placeholder: 'host' });
  const isolation = h('select', { name: 'isolation' },
    h('option', { value: '' }, 'default'), h('option', { value: 'namespace' }, 'namespace'),
    h('option', { value: 'gvisor' }, 'gvisor'));
  const cpus = h('input', { name: 'cpus', inputmode: 'decimal', placeholder: 'default' });
  const memory = h('input', { name: 'memory', placeholder: '512M' });
  const timeout = h('input', { name: 'timeout', placeholder: '5m' });
  const name = h('input', { name: 'name' });
  const tags = h('input', { name: 'tags', placeholder: 'key=value, key2=value2' });
  const mode = h('select', { name: 'network' },
    h('option', { value: '' }, 'default'), h('option', { value: 'none' }, 'none'),
    h('option', { value: 'allow' }, 'allow-list'), h('option', { value: 'open' }, 'open'));
  const allow = h('textarea', { name: 'allow', rows: 3, placeholder: 'api.example.com:443\n203.0.113.0/24' });
  const status = h('p', { class: 'error', role: 'alert' });
  const form = h('form', { class: 'card', id: 'create-form', onsubmit: async (e) => {
    e.preventDefault();
    const body = {};
    if (image.value.trim()) body.image = image.value.trim();
    if (isolation.value) body.isolation = isolation.value;
    if (name.value.trim()) body.name = name.value.trim();
    const res = {};
    if (cpus.value.trim()) res.cpus = Number(cpus.value);
    if (memory.value.trim()) res.memory = memory.value.trim();
    if (Object.keys(res).length) body.resources = res;
    if (timeout.value.trim()) body.timeout = timeout.value.trim();
    if (mode.value) body.network = mode.value === 'allow' ? { mode: 'allow', allow: allowRules(allow.value) } : { mode: mode.value };
    if (tags.value.trim()) {
      body.tags = Object.fromEntries(tags.value.split(',').map((t) => t.trim()).filter(Boolean).map((t) => {
        const i = t.indexOf('=');
        return i < 0 ? [t, ''] : [t.slice(0, i).trim(), t.slice(i + 1).trim()];
      }));
    }
    put(status, 'Creating…');
    try {
      const sb = await api('POST', '/v1/sandboxes', { json: body });
      put(status);
      toast(`Created ${sb.id}`);
      done();
    } catch (err) {
      put(status, err.field ? `${err.field}: ${err.message}` : err.message);
    }
  } },
  h('h2', {}, 'New sandbox'),
  h('div', { class: 'grid' },
    field('Image', image), field('Isolation', isolation), field('CPUs', cpus), field('Memory', memory),
    field('Lifetime', timeout), field('Name', name), field('Tags', tags), field('Network', mode)),
  field('Allowed destinations (allow-list; one per line)', allow),
  h('button', { type: 'submit' }, 'Create'),
  status);
  return form;
}
