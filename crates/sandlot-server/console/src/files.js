// The sandbox's files: a directory listing, upload into it, download a file.
import { api, sandboxPath } from './api.js';
import { h, put, table, toast, field } from './dom.js';
import { bytes, time } from './format.js';

function join(dir, name) {
  return dir.endsWith('/') ? dir + name : `${dir}/${name}`;
}

function parent(dir) {
  const p = dir.replace(/\/+$/, '').replace(/\/[^/]*$/, '');
  return p || '/';
}

/** A mode as octal (`0644`), whether the API gave a number or a string. */
function mode(m) {
  if (typeof m === 'number') return (m & 0o7777).toString(8).padStart(4, '0');
  return m || '';
}

export function filesPanel(id, cleanups) {
  let dir = '/tmp';
  const path = h('input', { name: 'path', value: dir, 'aria-label': 'Directory' });
  const list = h('div', { id: 'file-list' });
  const upload = h('input', { type: 'file', name: 'upload', multiple: true, 'aria-label': 'Files to upload' });

  async function load(to) {
    if (to !== undefined) dir = to;
    path.value = dir;
    try {
      const r = await api('GET', sandboxPath(id, '/files/list'), { query: { path: dir } });
      const rows = r.entries.map((e) => {
        const name = e.path.split('/').pop();
        const open = e.kind === 'dir'
          ? h('button', { type: 'button', class: 'link', onclick: () => load(e.path) }, `${name}/`)
          : h('span', { class: 'file-name' }, name);
        return {
          attrs: { 'data-path': e.path },
          cells: [open, e.kind, e.kind === 'file' ? bytes(e.size) : '', mode(e.mode), time(e.mtime),
            e.kind === 'file' ? h('button', { type: 'button', onclick: () => download(e.path) }, 'Download') : ''],
        };
      });
      put(list, dir !== '/' ? h('button', { type: 'button', class: 'link', onclick: () => load(parent(dir)) }, '↑ parent') : null,
        table(`Files in ${dir}`, ['Name', 'Kind', 'Size', 'Mode', 'Modified', ''], rows, 'Empty directory.'),
        r.truncated ? h('p', {}, 'The listing was cut short.') : null);
    } catch (err) {
      put(list, h('p', { class: 'error' }, `${dir}: ${err.message}`));
    }
  }

  async function download(p) {
    try {
      const r = await api('GET', sandboxPath(id, '/files'), { query: { path: p }, raw: true });
      const url = URL.createObjectURL(await r.blob());
      const a = h('a', { href: url, download: p.split('/').pop() || 'download' });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (err) {
      toast(`download ${p}: ${err.message}`, 'error');
    }
  }

  async function send() {
    for (const f of upload.files) {
      try {
        await api('PUT', sandboxPath(id, '/files'), { query: { path: join(dir, f.name) }, body: f,
          headers: { 'Content-Type': 'application/octet-stream' } });
        toast(`uploaded ${f.name}`);
      } catch (err) {
        toast(`upload ${f.name}: ${err.message}`, 'error');
      }
    }
    upload.value = '';
    load();
  }

  cleanups.push(() => {});
  load();
  return h('section', { 'aria-labelledby': 'files-h' },
    h('h2', { id: 'files-h' }, 'Files'),
    h('form', { class: 'inline', onsubmit: (e) => { e.preventDefault(); load(path.value.trim() || '/'); } },
      field('Directory', path), h('button', { type: 'submit' }, 'List')),
    h('form', { class: 'inline', onsubmit: (e) => { e.preventDefault(); send(); } },
      field('Upload here', upload), h('button', { type: 'submit', id: 'upload-button' }, 'Upload')),
    list);
}
