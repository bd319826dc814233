// The tenant's document collections (browsed with the read-only virtual shell)
// and memory stores (searched, read, and their history). Everything shown is text.
import { api } from './api.js';
import { h, put, refill, table, field, toast } from './dom.js';
import { bytes, time } from './format.js';

const enc = encodeURIComponent;

/** A picker of `names` (a select) that calls `open(name)` on change. */
function picker(label, names, open) {
  const sel = h('select', { 'aria-label': label, onchange: () => sel.value && open(sel.value) },
    h('option', { value: '' }, `choose a ${label.toLowerCase()}…`),
    names.map((n) => h('option', { value: n }, n)));
  return sel;
}

export function collectionsPage(main) {
  const list = h('div', { id: 'collections-list' });
  const shell = h('section', { id: 'vfs-shell', 'aria-labelledby': 'vfs-h' });
  let session = null; // { collection, id }

  async function close() {
    if (!session) return;
    const s = session;
    session = null;
    try { await api('DELETE', `/v1/vfs/${enc(s.collection)}/sessions/${enc(s.id)}`); } catch { /* gone */ }
  }

  async function open(name) {
    await close();
    try {
      const s = await api('POST', `/v1/vfs/${enc(name)}/sessions`, { json: { principal: 'console' } });
      session = { collection: name, id: s.id };
      const out = h('pre', { id: 'vfs-output', class: 'output' });
      const cwd = h('code', { id: 'vfs-cwd' }, s.cwd);
      const input = h('input', { name: 'command', autocomplete: 'off', spellcheck: 'false', size: 60,
        placeholder: 'ls, cat, grep -r, find, head, wc…' });
      const form = h('form', { class: 'inline', onsubmit: async (e) => {
        e.preventDefault();
        const command = input.value.trim();
        if (!command || !session) return;
        try {
          const r = await api('POST', `/v1/vfs/${enc(name)}/sessions/${enc(session.id)}/run`, { json: { command } });
          put(out, `$ ${command}\n`, r.stdout, r.stderr ? `\n${r.stderr}` : '',
            r.truncated ? '\n[output cut at the session\'s limit]' : '', `\n[exit ${r.exit_code}]`);
          put(cwd, r.cwd);
          input.select();
        } catch (err) { toast(`run: ${err.message}`, 'error'); }
      } }, field('Command', input), h('button', { type: 'submit' }, 'Run'));
      refill(shell, h('h2', { id: 'vfs-h' }, `Shell on ${name}`),
        h('p', { class: 'muted' }, `version ${s.version}, ${s.documents} documents visible; working directory `, cwd),
        form, out);
      input.focus();
    } catch (err) {
      put(shell, h('p', { class: 'error' }, `${name}: ${err.message}`));
    }
  }

  async function refresh() {
    try {
      const cs = (await api('GET', '/v1/vfs')).collections;
      refill(list, picker('Collection', cs.map((c) => c.name), open),
        table('Collections', ['Name', 'Version', 'Documents', 'Size', 'Source', 'Updated', 'Sessions'],
          cs.map((c) => ({ cells: [c.name, String(c.version), String(c.documents), bytes(c.bytes), c.source,
            time(c.updated_at), String(c.sessions)] })), 'No collections.'));
    } catch (err) {
      put(list, h('p', { class: 'error' }, `Collections: ${err.message}`));
    }
  }
  put(main, h('section', { 'aria-labelledby': 'page-h' }, h('h1', { id: 'page-h' }, 'Collections'), list), shell);
  refresh();
  return () => { close(); };
}

export function memoryPage(main) {
  const list = h('div', { id: 'stores-list' });
  const pane = h('section', { id: 'memory-store', 'aria-labelledby': 'store-h' });

  async function view(store, key, into) {
    try {
      const m = await api('GET', `/v1/memory/${enc(store)}/memories/${enc(key)}`);
      const log = await api('GET', `/v1/memory/${enc(store)}/log`, { query: { key, limit: 20 } });
      put(into, h('h3', {}, m.title || key), h('pre', { id: 'memory-text', class: 'output' }, m.text || m.body || ''),
        table('History', ['When', 'Message', 'Revision'], (log.commits || []).map((c) => ({
          cells: [time(c.time), c.message, h('code', {}, String(c.rev).slice(0, 12))],
        })), 'No history.'));
    } catch (err) {
      put(into, h('p', { class: 'error' }, `${key}: ${err.message}`));
    }
  }

  function open(store) {
    const hits = h('div', { id: 'memory-hits' });
    const shown = h('div', { id: 'memory-view' });
    const text = h('input', { type: 'search', name: 'query', size: 50, placeholder: 'what are you looking for?' });
    const form = h('form', { class: 'inline', onsubmit: async (e) => {
      e.preventDefault();
      try {
        const r = await api('POST', `/v1/memory/${enc(store)}/search`, { json: { text: text.value, limit: 20 } });
        refill(hits, table('Hits', ['Title', 'Path', 'Snippet', 'Score'], r.hits.map((x) => ({
          cells: [h('button', { type: 'button', class: 'link', onclick: () => view(store, x.path, shown) }, x.title || x.path),
            h('code', {}, x.path), x.snippet || '', Number(x.score).toFixed(3)],
        })), 'Nothing found.'));
      } catch (err) { toast(`search: ${err.message}`, 'error'); }
    } }, field('Search', text), h('button', { type: 'submit' }, 'Search'));
    refill(pane, h('h2', { id: 'store-h' }, `Memory store ${store}`), form, hits, shown);
    text.focus();
  }

  async function refresh() {
    try {
      const stores = (await api('GET', '/v1/memory')).stores;
      refill(list, picker('Store', stores.map((s) => s.name), open),
        table('Memory stores', ['Name'], stores.map((s) => ({ cells: [s.name] })), 'No memory stores.'));
    } catch (err) {
      put(list, h('p', { class: 'error' }, `Memory stores: ${err.message}`));
    }
  }
  put(main, h('section', { 'aria-labelledby': 'page-h' }, h('h1', { id: 'page-h' }, 'Memory'), list), pane);
  refresh();
  return () => {};
}
