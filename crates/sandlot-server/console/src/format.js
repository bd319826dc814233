// Human forms of the API's numbers and times.

export function bytes(n) {
  if (n === null || n === undefined) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return '';
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

/** Seconds since an RFC 3339 time. */
export function since(at) {
  return at ? (Date.now() - Date.parse(at)) / 1000 : null;
}

/** Seconds until an RFC 3339 time. */
export function until(at) {
  return at ? (Date.parse(at) - Date.now()) / 1000 : null;
}

export function time(at) {
  return at ? new Date(at).toLocaleString() : '';
}

/** `512M`, `1G`, `1048576` as given: the API parses sizes itself. */
export function tagsText(tags) {
  return Object.entries(tags || {}).map(([k, v]) => (v === '' ? k : `${k}=${v}`));
}
