// Builds the console's DOM. Every string passed as a child becomes a text node and
// every attribute is set with setAttribute: no data a tenant controls (tags, file
// names, process output, host names) is ever parsed as HTML. No module of the
// console uses an HTML-parsing sink (a unit test of console.rs lists them).

/** An element: h('td', {class: 'x'}, 'text', child, ...). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) {
      if (typeof v !== 'function') throw new TypeError(`${k} must be a function`);
      el.addEventListener(k.slice(2), v);
    } else if (k === 'class') {
      el.className = v;
    } else if (k === 'value') {
      el.value = v;
    } else {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  add(el, children);
  return el;
}

/** Appends children (nodes, strings as text, nested arrays; null skipped). */
export function add(el, children) {
  for (const c of [children].flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replaces an element's children. */
export function put(el, ...children) {
  el.replaceChildren();
  return add(el, children);
}

/** A short message for the user (errors, confirmations). */
export function toast(message, kind = 'info') {
  const t = document.getElementById('toast');
  put(t, h('span', { class: kind }, message));
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.replaceChildren(), 6000);
}

/** A table with a header row; rows are arrays of cells (nodes or strings). */
export function table(caption, heads, rows, empty = 'Nothing here.') {
  if (rows.length === 0) return h('p', { class: 'empty' }, empty);
  return h('div', { class: 'scroll' },
    h('table', {},
      h('caption', { class: 'sr-only' }, caption),
      h('thead', {}, h('tr', {}, heads.map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, rows.map((r) => h('tr', r.attrs || {},
        r.cells.map((c, i) => h('td', { 'data-label': heads[i] }, c)))))));
}

/** A labelled form field. */
export function field(label, input, hint) {
  const id = input.id || `f-${Math.random().toString(36).slice(2)}`;
  input.id = id;
  return h('div', { class: 'field' }, h('label', { for: id }, label), input,
    hint ? h('small', {}, hint) : null);
}

/** What identifies a focused control across a re-render: its row's key and its
    own tag, name and label. */
function focusKey(el) {
  const row = el.closest('[data-id],[data-path]');
  return [row ? (row.dataset.id || row.dataset.path) : '', el.tagName, el.name || '', el.textContent];
}

/** Replaces `el`'s children with `children`, keeping the keyboard focus on the
    equivalent control when it was inside (a live table re-renders every few
    seconds; a keyboard user must not lose their place). */
export function refill(el, ...children) {
  const active = document.activeElement;
  const key = active && el.contains(active) ? JSON.stringify(focusKey(active)) : null;
  put(el, ...children);
  if (key) {
    const same = [...el.querySelectorAll('a, button, input, select')].find((c) => JSON.stringify(focusKey(c)) === key);
    if (same) same.focus({ preventScroll: true });
  }
  return el;
}
