// The public HTTP API, called with the signed-in token. The token lives in this
// tab's sessionStorage only (gone when the tab closes), is sent as
// `Authorization: Bearer` on every request and, for WebSockets (where a browser
// cannot set headers), as the subprotocol `sandlot.bearer.TOKEN`.

const KEY = 'sandlot.token';

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, error) {
    super(error && error.message ? error.message : `HTTP ${status}`);
    this.status = status;
    this.code = error ? error.code : undefined;
    this.field = error ? error.field : undefined;
  }
}

/** Calls the API; answers the parsed JSON (null for 204), or the Response with raw. */
export async function api(method, path, { json, body, query, raw, headers = {}, signal } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    for (const one of [v].flat()) if (one !== undefined && one !== '') url.searchParams.append(k, one);
  }
  const h = { Authorization: `Bearer ${token.get()}`, ...headers };
  if (json !== undefined) {
    h['Content-Type'] = 'application/json';
    body = JSON.stringify(json);
  }
  const r = await fetch(url, { method, headers: h, body, credentials: 'omit', cache: 'no-store', signal });
  if (r.status === 401) {
    token.clear();
    window.dispatchEvent(new Event('sandlot:signed-out'));
  }
  if (!r.ok) {
    let err;
    try { err = (await r.json()).error; } catch { err = undefined; }
    throw new ApiError(r.status, err);
  }
  if (raw) return r;
  if (r.status === 204) return null;
  return r.json();
}

/** `/v1/sandboxes/{id}` and what follows, with the id escaped. */
export function sandboxPath(id, rest = '') {
  return `/v1/sandboxes/${encodeURIComponent(id)}${rest}`;
}

/** A WebSocket to this origin carrying the token as a subprotocol. */
export function socket(path) {
  const url = new URL(path, location.origin);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  return new WebSocket(url, ['sandlot.v1', `sandlot.bearer.${token.get()}`]);
}
