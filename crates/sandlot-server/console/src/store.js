// The tenant's images (tags, parents), volumes and secrets (names only: the API
// never returns a secret's value, and the form clears the one it sent).
import { api } from './api.js';
import { h, put, refill, table, field, toast } from './dom.js';
import { bytes, time } from './format.js';

function short(id) {
  return id ? id.replace(/^sha256:/, '').slice(0, 12) : '';
}

/** A page of one kind: a heading, an optional form, a filtered table. */
function listPage(main, { title, load, heads, row, form, empty }) {
  const filter = h('input', { type: 'search', placeholder: 'filter…', 'aria-label': `Filter ${title.toLowerCase()}` });
  const list = h('div', { id: `${title.toLowerCase()}-list` });
  let items = [];
  function render() {
    const q = filter.value.trim().toLowerCase();
    const rows = items.map(row).filter((r) => !q || r.text.toLowerCase().includes(q));
    refill(list, table(title, heads, rows, items.length ? 'Nothing matches the filter.' : empty));
  }
  async function refresh() {
    try {
      items = await load();
      render();
    } catch (err) {
      put(list, h('p', { class: 'error' }, `${title}: ${err.message}`));
    }
  }
  filter.addEventListener('input', render);
  put(main, h('section', { 'aria-labelledby': 'page-h' },
    h('div', { class: 'bar' }, h('h1', { id: 'page-h' }, title), filter), list),
  form ? form(refresh) : null);
  refresh();
  return () => {};
}

export function imagesPage(main) {
  return listPage(main, {
    title: 'Images',
    empty: 'No images.',
    load: async () => (await api('GET', '/v1/images')).images,
    heads: ['Image', 'Tags', 'Parent', 'Source', 'Owner', 'Size', 'Created'],
    row: (im) => ({
      text: [im.id, ...(im.tags || []), im.parent, im.source, im.owner].join(' '),
      attrs: { 'data-id': im.id },
      cells: [h('code', { title: im.id }, short(im.id)),
        h('span', { class: 'tags' }, (im.tags || []).map((t) => h('span', { class: 'tag' }, t))),
        im.parent ? h('code', { title: im.parent }, short(im.parent)) : (im.base || ''),
        im.source || '', im.owner || '', bytes(im.size), time(im.created_at)],
    }),
  });
}

function removeButton(what, name, path, done) {
  return h('button', { type: 'button', class: 'danger', onclick: async () => {
    if (!window.confirm(`Delete ${what} ${name}?`)) return;
    try {
      await api('DELETE', path);
      toast(`deleted ${what} ${name}`);
    } catch (err) {
      toast(`delete ${what} ${name}: ${err.message}`, 'error');
    }
    done();
  } }, 'Delete');
}

export function volumesPage(main) {
  let reload = () => {};
  return listPage(main, {
    title: 'Volumes',
    empty: 'No volumes.',
    load: async () => (await api('GET', '/v1/volumes')).volumes,
    heads: ['Name', 'Tenant', 'Size limit', 'Created', ''],
    row: (v) => ({
      text: `${v.name} ${v.tenant}`,
      attrs: { 'data-id': v.name },
      cells: [v.name, v.tenant, v.size_limit ? bytes(v.size_limit) : 'none', time(v.created_at),
        removeButton('volume', v.name, `/v1/volumes/${encodeURIComponent(v.name)}`, () => reload())],
    }),
    form: (refresh) => {
      reload = refresh;
      const name = h('input', { name: 'name', required: true });
      const limit = h('input', { name: 'size_limit', placeholder: 'none, or 1G' });
      const status = h('p', { class: 'error', role: 'alert' });
      return h('form', { class: 'card', id: 'volume-form', onsubmit: async (e) => {
        e.preventDefault();
        const body = { name: name.value.trim() };
        if (limit.value.trim()) body.size_limit = limit.value.trim();
        try {
          await api('POST', '/v1/volumes', { json: body });
          name.value = '';
          limit.value = '';
          put(status);
        } catch (err) {
          put(status, err.field ? `${err.field}: ${err.message}` : err.message);
        }
        refresh();
      } }, h('h2', {}, 'New volume'), h('div', { class: 'grid' }, field('Name', name), field('Size limit', limit)),
      h('button', { type: 'submit' }, 'Create'), status);
    },
  });
}

export function secretsPage(main) {
  let reload = () => {};
  return listPage(main, {
    title: 'Secrets',
    empty: 'No secrets.',
    load: async () => (await api('GET', '/v1/secrets')).secrets,
    heads: ['Name', 'Tenant', 'Created', ''],
    row: (s) => ({
      text: `${s.name} ${s.tenant}`,
      attrs: { 'data-id': s.name },
      cells: [s.name, s.tenant, time(s.created_at),
        removeButton('secret', s.name, `/v1/secrets/${encodeURIComponent(s.name)}`, () => reload())],
    }),
    form: (refresh) => {
      reload = refresh;
      const name = h('input', { name: 'name', required: true });
      const value = h('input', { name: 'value', type: 'password', autocomplete: 'off', required: true });
      const status = h('p', { class: 'error', role: 'alert' });
      return h('form', { class: 'card', id: 'secret-form', onsubmit: async (e) => {
        e.preventDefault();
        try {
          await api('POST', '/v1/secrets', { json: { name: name.value.trim(), value: value.value } });
          name.value = '';
          put(status);
        } catch (err) {
          put(status, err.field ? `${err.field}: ${err.message}` : err.message);
        }
        value.value = ''; // the value is the API's from here on, never shown again
        refresh();
      } }, h('h2', {}, 'New secret'), h('p', {}, 'The value is stored by the daemon and never shown again.'),
      h('div', { class: 'grid' }, field('Name', name), field('Value', value)),
      h('button', { type: 'submit' }, 'Create'), status);
    },
  });
}
