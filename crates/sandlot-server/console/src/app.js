// The console's entry: sign-in, the header, and the hash router
// (#/ the sandboxes, #/sandboxes/ID one sandbox, #/operator the operator's page).
import { api, token, ApiError } from './api.js';
import { h, put, field, toast } from './dom.js';
import { sandboxesPage } from './sandboxes.js';
import { sandboxPage } from './sandbox.js';
import { imagesPage, volumesPage, secretsPage } from './store.js';
import { collectionsPage, memoryPage } from './knowledge.js';
import { operatorPage } from './operator.js';

const PAGES = {
  '/images': imagesPage, '/volumes': volumesPage, '/secrets': secretsPage,
  '/collections': collectionsPage, '/memory': memoryPage, '/operator': operatorPage,
};

const main = document.getElementById('main');
let leave = null; // the current page's clean-up (timers, sockets)
let me = null; // `GET /v1/health` of the signed-in token

function signInPage(message) {
  const input = h('input', { type: 'password', autocomplete: 'off', spellcheck: 'false', required: true, name: 'token' });
  const status = h('p', { class: 'error', role: 'alert' }, message || '');
  const form = h('form', { class: 'card signin', onsubmit: async (e) => {
    e.preventDefault();
    token.set(input.value.trim());
    try {
      await whoAmI();
      input.value = '';
      route();
    } catch (err) {
      token.clear();
      input.select();
      put(status, err instanceof ApiError && err.status === 401 ? 'That token is not valid.' : `Sign-in failed: ${err.message}`);
    }
  } },
  h('h1', {}, 'Sign in'),
  h('p', {}, 'Paste an API token. It stays in this tab only and is sent with each request.'),
  field('Token', input),
  h('button', { type: 'submit' }, 'Sign in'),
  status);
  put(main, form);
  input.focus();
}

async function whoAmI() {
  const health = await api('GET', '/v1/health');
  me = health;
  const operator = health.tenant === '*';
  put(document.getElementById('nav'), [['#/', 'Sandboxes'], ['#/images', 'Images'], ['#/volumes', 'Volumes'],
    ['#/secrets', 'Secrets'], ['#/collections', 'Collections'], ['#/memory', 'Memory'],
    ...(operator ? [['#/operator', 'Operator']] : [])].map(([href, label]) => h('a', { href }, label)));
  put(document.getElementById('who'),
    h('span', {}, operator ? 'operator' : `tenant ${health.tenant}`), ' ',
    h('button', { type: 'button', class: 'link', onclick: signOut }, 'Sign out'));
  return health;
}

function signOut() {
  token.clear();
  me = null;
  document.getElementById('nav').replaceChildren();
  document.getElementById('who').replaceChildren();
  route();
}

async function route() {
  if (leave) { leave(); leave = null; }
  main.replaceChildren();
  if (!token.get()) { signInPage(); return; }
  if (!document.getElementById('who').hasChildNodes()) {
    try { await whoAmI(); } catch (err) { signInPage(err.message); return; }
  }
  const hash = location.hash.replace(/^#/, '') || '/';
  const m = hash.match(/^\/sandboxes\/([^/]+)$/);
  // The operator's page polls the operator's routes: a tenant's token never
  // starts it (the API would refuse it every few seconds).
  if (hash === '/operator' && me?.tenant !== '*') {
    put(main, h('p', { id: 'not-operator', class: 'error' }, 'The operator page is for an operator token.'));
  } else if (m) leave = sandboxPage(main, decodeURIComponent(m[1]));
  else leave = (Object.hasOwn(PAGES, hash) ? PAGES[hash] : sandboxesPage)(main);
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.getAttribute('href') === `#${hash === '/' || m ? '/' : hash}`) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  main.focus({ preventScroll: true });
}

window.addEventListener('hashchange', route);
window.addEventListener('sandlot:signed-out', () => {
  const who = document.getElementById('who');
  if (!who.hasChildNodes()) return; // a sign-in attempt: its form says why
  who.replaceChildren();
  me = null;
  document.getElementById('nav').replaceChildren();
  toast('Signed out: the token was refused.', 'error');
  route();
});
window.addEventListener('DOMContentLoaded', route);
if (document.readyState !== 'loading') route();
