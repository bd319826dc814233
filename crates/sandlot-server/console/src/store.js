// The tenant's images (a tree of parents, tags, and the diff of two), volumes and secrets (names only: the API
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

/** The images in tree order, each with its depth under the parent it names:
    roots first (an image without a parent, or whose parent this token does not
    see), each followed by its children, oldest first. A parent chain that loops
    (it cannot in a content-addressed store; the console does not rely on that)
    ends where it would repeat. */
export function imageTree(images) {
  const byId = new Map(images.map((im) => [im.id, im]));
  const children = new Map();
  const roots = [];
  for (const im of images) {
    if (im.parent && byId.has(im.parent) && im.parent !== im.id) {
      if (!children.has(im.parent)) children.set(im.parent, []);
      children.get(im.parent).push(im);
    } else {
      roots.push(im);
    }
  }
  const older = (x, y) => String(x.created_at || '').localeCompare(String(y.created_at || '')) || x.id.localeCompare(y.id);
  const out = [];
  const seen = new Set();
  const walk = (im, depth) => {
    if (seen.has(im.id)) return;
    seen.add(im.id);
    out.push({ image: im, depth });
    for (const c of (children.get(im.id) || []).sort(older)) walk(c, depth + 1);
  };
  for (const r of roots.sort(older)) walk(r, 0);
  for (const im of images) walk(im, 0); // members of a loop, were there one
  return out;
}

const DIFF_SHOWN = 500; // paths listed per kind; the count says the rest

/** The diff's answer: the paths `b` adds to, changes in and removes from `a`. */
function diffView(a, b, d) {
  const kinds = [['added', 'Added', '+'], ['changed', 'Changed', '~'], ['removed', 'Removed', '-']];
  return h('div', { id: 'image-diff-result' },
    h('p', {}, 'What ', h('code', { title: b.id }, imageName(b)), ' adds, changes and removes relative to ',
      h('code', { title: a.id }, imageName(a)), '.'),
    kinds.map(([k, label, mark]) => {
      const paths = d[k] || [];
      return h('section', { class: `diff-${k}`, 'aria-labelledby': `diff-${k}-h` },
        h('h3', { id: `diff-${k}-h` }, `${label} (${paths.length})`),
        paths.length === 0 ? h('p', { class: 'empty' }, 'None.')
          : h('ul', { class: 'paths' }, paths.slice(0, DIFF_SHOWN).map((p) =>
            h('li', {}, h('span', { class: 'mark', 'aria-hidden': 'true' }, mark), ' ', h('code', {}, p)))),
        paths.length > DIFF_SHOWN ? h('p', { class: 'muted' }, `and ${paths.length - DIFF_SHOWN} more`) : null);
    }));
}

function imageName(im) {
  return (im.tags && im.tags[0]) || short(im.id);
}

export function imagesPage(main) {
  const selected = []; // at most two images, in the order they were chosen
  const diffButton = h('button', { type: 'button', id: 'image-diff-button', disabled: true }, 'Diff');
  const diffHint = h('p', { class: 'muted', id: 'image-diff-hint' }, 'Choose two images in the list to compare them.');
  const diffOut = h('div', { 'aria-live': 'polite' });
  function syncDiff() {
    diffButton.disabled = selected.length !== 2;
    put(diffHint, selected.length === 2
      ? ['Compare ', h('code', {}, imageName(selected[0])), ' (before) with ', h('code', {}, imageName(selected[1])), ' (after).']
      : 'Choose two images in the list to compare them.');
  }
  diffButton.addEventListener('click', async () => {
    if (selected.length !== 2) return;
    const [a, b] = selected;
    put(diffOut, h('p', { class: 'muted' }, 'Comparing…'));
    try {
      const d = await api('GET', '/v1/images/diff', { query: { a: a.id, b: b.id } });
      put(diffOut, diffView(a, b, d));
    } catch (err) {
      put(diffOut, h('p', { class: 'error', role: 'alert' }, `Diff: ${err.message}`));
    }
  });
  function chooser(im) {
    const box = h('input', { type: 'checkbox', name: 'compare', 'aria-label': `Compare ${imageName(im)}` });
    box.checked = selected.some((x) => x.id === im.id);
    box.addEventListener('change', () => {
      const i = selected.findIndex((x) => x.id === im.id);
      if (box.checked && i < 0) {
        selected.push(im);
        if (selected.length > 2) {
          const dropped = selected.shift();
          const other = document.querySelector(`#images-list tr[data-id="${CSS.escape(dropped.id)}"] input[name=compare]`);
          if (other) other.checked = false;
        }
      } else if (!box.checked && i >= 0) {
        selected.splice(i, 1);
      }
      syncDiff();
    });
    return box;
  }
  return listPage(main, {
    title: 'Images',
    empty: 'No images.',
    load: async () => imageTree((await api('GET', '/v1/images')).images),
    heads: ['Compare', 'Image', 'Tags', 'Parent', 'Source', 'Owner', 'Size', 'Created'],
    row: ({ image: im, depth }) => ({
      text: [im.id, ...(im.tags || []), im.parent, im.source, im.owner].join(' '),
      attrs: { 'data-id': im.id, 'data-depth': depth },
      cells: [chooser(im),
        h('span', { class: 'tree', style: `padding-left: ${Math.min(depth, 12) * 1.1}rem` },
          depth > 0 ? h('span', { class: 'branch', 'aria-hidden': 'true' }, '└ ') : null,
          h('code', { title: im.id }, short(im.id)),
          depth > 0 ? h('span', { class: 'sr-only' }, ` (level ${depth + 1}, child of ${short(im.parent)})`) : null),
        h('span', { class: 'tags' }, (im.tags || []).map((t) => h('span', { class: 'tag' }, t))),
        im.parent ? h('code', { title: im.parent }, short(im.parent)) : (im.base || ''),
        im.source || '', im.owner || '', bytes(im.size), time(im.created_at)],
    }),
    form: () => h('section', { class: 'card', id: 'image-diff', 'aria-labelledby': 'image-diff-h' },
      h('h2', { id: 'image-diff-h' }, 'Diff of two images'), diffHint, diffButton, diffOut),
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
