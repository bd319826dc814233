// The operator's page (#/operator), shown when the signed-in token is the
// operator's (`GET /v1/health` answers tenant `*`): every tenant with its quota
// and usage (`GET /v1/tenants`), the API tokens (create a tenant token, its secret
// shown once; revoke, asking first), the warm pools and a few of the daemon's
// numbers from `/metrics`, with two of them drawn over the time the page is open.
// Tenant names, token names and metrics labels are data: text nodes only.
import { api } from './api.js';
import { h, put, refill, table, field, toast } from './dom.js';
import { bytes, duration, time } from './format.js';
import { chart } from './usage.js';

const REFRESH_MS = 5000;
const KEEP_POINTS = 120; // ten minutes of refreshes

/** `used / max` with the share in percent, for a quota cell. */
function ofQuota(used, max, fmt = String) {
  const pct = max > 0 ? ` (${Math.round((used / max) * 100)}%)` : '';
  return `${fmt(used)} / ${fmt(max)}${pct}`;
}

/** The samples of Prometheus text: [{name, labels, value}]; comments skipped.
    Label values are kept as the strings they are. */
export function parseMetrics(text) {
  const out = [];
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const l of text.split('\n')) {
    if (!l || l.startsWith('#')) continue;
    const m = l.match(line);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of (m[2] || '').matchAll(label)) labels[k] = v.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

/** The sum of a metric's samples (every label set), or null when absent. */
function total(samples, name) {
  const s = samples.filter((x) => x.name === name);
  return s.length ? s.reduce((a, x) => a + x.value, 0) : null;
}

function tenantsTable(tenants) {
  return table('Tenants', ['Tenant', 'Sandboxes', 'Paused', 'Memory', 'In use', 'CPU time', 'Snapshots', 'Saved', 'Tokens'],
    tenants.map((t) => {
      const q = t.quota;
      const u = t.usage;
      return {
        attrs: { 'data-id': t.name },
        cells: [
          h('span', {}, t.name, t.configured ? '' : h('small', { class: 'muted' }, ' (default quota)')),
          ofQuota(u.sandboxes_live + u.sandboxes_paused, q.max_sandboxes),
          String(u.sandboxes_paused),
          ofQuota(u.memory_limit_bytes, q.max_memory_bytes, bytes),
          bytes(u.memory_in_use_bytes),
          duration(u.cpu_seconds),
          ofQuota(u.snapshots, q.max_snapshots),
          ofQuota(u.saved_bytes, q.max_saved_disk_bytes, bytes),
          String(u.active_tokens),
        ],
      };
    }), 'No tenants yet: create a tenant token below.');
}

function poolsTable(samples) {
  const pools = new Map();
  for (const s of samples) {
    if (!s.name.startsWith('sandlot_pool_') || s.labels.pool === undefined) continue;
    if (!pools.has(s.labels.pool)) pools.set(s.labels.pool, {});
    pools.get(s.labels.pool)[s.name.slice('sandlot_pool_'.length)] = s.value;
  }
  const v = (x) => (x === undefined ? '' : String(x));
  return table('Warm pools', ['Pool', 'Ready', 'Target', 'Max', 'Hits', 'Misses', 'Refill failures'],
    [...pools.entries()].map(([name, p]) => ({
      attrs: { 'data-id': name },
      cells: [name, v(p.ready), v(p.target), v(p.max), v(p.hits_total), v(p.misses_total), v(p.refill_failures_total)],
    })), 'No warm pools are configured.');
}

function daemonNumbers(samples) {
  const n = (name) => total(samples, name);
  const rows = [
    ['Live sandboxes', n('sandlot_sandboxes_live')],
    ['Sandboxes created', n('sandlot_sandboxes_created_total')],
    ['Sandboxes stopped', n('sandlot_sandboxes_stopped_total')],
    ['HTTP requests', n('sandlot_http_requests_total')],
    ['HTTP errors', n('sandlot_http_errors_total')],
    ['Egress connections open', n('sandlot_egress_connections_open')],
    ['Egress connections refused', n('sandlot_egress_refused_total')],
    ['Published ports', n('sandlot_ports_published')],
    ['Open files', n('sandlot_open_files') === null ? null
      : `${n('sandlot_open_files')} of ${n('sandlot_open_files_limit') ?? '?'}`],
  ].filter(([, value]) => value !== null);
  return h('dl', { class: 'spec', id: 'daemon-numbers' }, rows.map(([k, value]) => [h('dt', {}, k), h('dd', {}, String(value))]));
}

/** The token list with a revoke button on each active tenant token. Operator
    tokens are revoked on the daemon's socket only, so they get none. */
function tokensTable(tokens, revoke) {
  return table('Tokens', ['Id', 'Kind', 'Tenant', 'Name', 'Created', 'Made by', 'Last used', 'Status', ''],
    tokens.map((t) => {
      let action = '';
      if (!t.revoked_at && t.kind === 'tenant') {
        action = h('button', { type: 'button', class: 'danger', onclick: () => revoke(t) }, 'Revoke');
      } else if (!t.revoked_at) {
        action = h('small', { class: 'muted' }, 'revoke on the socket');
      }
      return {
        attrs: { 'data-id': t.id },
        cells: [h('code', {}, t.id), t.kind, t.kind === 'operator' ? '' : t.tenant, t.name || '',
          time(t.created_at), t.created_by || '', t.last_used_at ? time(t.last_used_at) : 'never',
          t.revoked_at ? `revoked ${time(t.revoked_at)}` : 'active', action],
      };
    }), 'No tokens.');
}

/** Renders the page into `main`; answers its clean-up. */
export function operatorPage(main) {
  let timer = null;
  let stopped = false;
  const history = { at: [], live: [], rps: [] };
  let lastRequests = null;
  const tenants = h('div', { id: 'tenant-list' });
  const tokens = h('div', { id: 'token-list' });
  const pools = h('div', { id: 'pool-list' });
  const numbers = h('div', { id: 'daemon' });
  const charts = h('div', { id: 'daemon-charts' });
  const secretBox = h('div', { id: 'new-token', 'aria-live': 'polite' });

  async function revoke(t) {
    const what = `token ${t.id} of tenant ${t.tenant}${t.name ? ` (${t.name})` : ''}`;
    if (!window.confirm(`Revoke ${what}? Requests with it are refused from now on.`)) return;
    try {
      await api('DELETE', `/v1/tokens/${encodeURIComponent(t.id)}`);
      toast(`revoked ${what}`);
    } catch (err) {
      toast(`revoke ${what}: ${err.message}`, 'error');
    }
    refresh();
  }

  function showSecret(made) {
    const secret = h('input', { type: 'text', readonly: true, value: made.token, 'aria-label': 'The new token', id: 'new-token-secret', spellcheck: 'false', size: 56 });
    put(secretBox, h('div', { class: 'card', role: 'region', 'aria-labelledby': 'new-token-h' },
      h('h3', { id: 'new-token-h' }, `Token ${made.id} for tenant ${made.tenant}`),
      h('p', {}, 'Copy it now: it is shown this once and the daemon keeps only its hash.'),
      secret, ' ',
      h('button', { type: 'button', onclick: () => secretBox.replaceChildren() }, 'Done')));
    secret.focus();
    secret.select();
  }

  const tenantInput = h('input', { name: 'tenant', required: true, autocomplete: 'off', spellcheck: 'false' });
  const nameInput = h('input', { name: 'name', autocomplete: 'off' });
  const formStatus = h('p', { class: 'error', role: 'alert' });
  const form = h('form', { class: 'card', id: 'token-form', onsubmit: async (e) => {
    e.preventDefault();
    const body = { tenant: tenantInput.value.trim() };
    if (nameInput.value.trim()) body.name = nameInput.value.trim();
    try {
      const made = await api('POST', '/v1/tokens', { json: body });
      tenantInput.value = '';
      nameInput.value = '';
      put(formStatus);
      showSecret(made);
    } catch (err) {
      put(formStatus, err.field ? `${err.field}: ${err.message}` : err.message);
    }
    refresh();
  } }, h('h3', {}, 'New tenant token'),
  h('div', { class: 'grid' }, field('Tenant', tenantInput, 'letters, digits, - _ .'), field('Name', nameInput, 'a label for the list')),
  h('button', { type: 'submit' }, 'Create token'), formStatus);

  function drawCharts(samples) {
    const live = total(samples, 'sandlot_sandboxes_live');
    const requests = total(samples, 'sandlot_http_requests_total');
    const now = Date.now();
    let rps = 0;
    if (lastRequests && requests !== null && now > lastRequests[1]) {
      rps = Math.max(0, (requests - lastRequests[0]) / ((now - lastRequests[1]) / 1000));
    }
    if (requests !== null) lastRequests = [requests, now];
    history.at.push(now);
    history.live.push(live ?? 0);
    history.rps.push(rps);
    for (const k of Object.keys(history)) history[k] = history[k].slice(-KEEP_POINTS);
    put(charts,
      chart('chart-live', 'Live sandboxes', history.at, history.live, Math.max(1, ...history.live), (v) => String(v)),
      chart('chart-rps', 'API requests per second', history.at, history.rps, Math.max(1, ...history.rps), (v) => v.toFixed(1)),
      h('p', { class: 'muted' }, `since this page opened, every ${REFRESH_MS / 1000} s`));
  }

  async function refresh() {
    clearTimeout(timer);
    const [ts, toks, metrics] = await Promise.allSettled([
      api('GET', '/v1/tenants'), api('GET', '/v1/tokens'),
      api('GET', '/metrics', { raw: true }).then((r) => r.text()),
    ]);
    if (stopped) return;
    if (ts.status === 'fulfilled') refill(tenants, tenantsTable(ts.value.tenants));
    else put(tenants, h('p', { class: 'error' }, `Tenants: ${ts.reason.message}`));
    if (toks.status === 'fulfilled') refill(tokens, tokensTable(toks.value.tokens.slice().reverse(), revoke));
    else put(tokens, h('p', { class: 'error' }, `Tokens: ${toks.reason.message}`));
    if (metrics.status === 'fulfilled') {
      const samples = parseMetrics(metrics.value);
      refill(pools, poolsTable(samples));
      put(numbers, daemonNumbers(samples));
      drawCharts(samples);
    } else {
      put(numbers, h('p', { class: 'error' }, `Metrics: ${metrics.reason.message}`));
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }

  put(main,
    h('section', { 'aria-labelledby': 'page-h' }, h('div', { class: 'bar' }, h('h1', { id: 'page-h' }, 'Operator')),
      h('p', { class: 'muted' }, 'Every tenant, as the operator sees them. This token is the operator\'s: keep it to this tab.')),
    h('section', { 'aria-labelledby': 'tenants-h' }, h('h2', { id: 'tenants-h' }, 'Tenants'), tenants),
    h('section', { 'aria-labelledby': 'tokens-h' }, h('h2', { id: 'tokens-h' }, 'Tokens'), secretBox, form, tokens),
    h('section', { 'aria-labelledby': 'pools-h' }, h('h2', { id: 'pools-h' }, 'Warm pools'), pools),
    h('section', { 'aria-labelledby': 'daemon-h' }, h('h2', { id: 'daemon-h' }, 'Daemon'), numbers, charts));
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
