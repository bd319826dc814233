// A sandbox's processes: the list (refreshed), a process's output read again
// from the start (or followed while it runs: a re-attach), and signals.
import { api, sandboxPath } from './api.js';
import { h, put, refill, table, toast } from './dom.js';
import { time } from './format.js';

/** The text of a base64 chunk (UTF-8, invalid bytes replaced). */
function decoded(b64) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new TextDecoder().decode(bytes);
}

export function processesPanel(id, cleanups, stateOf) {
  const list = h('div', { id: 'processes' });
  const viewer = h('div', { id: 'process-output' });
  let timer = null;
  let stopped = false;
  let reading = null;

  function exitText(p) {
    if (!p.exit) return p.state;
    if (p.exit.timed_out) return 'timed out';
    if (p.exit.signal !== null && p.exit.signal !== undefined) return `killed (signal ${p.exit.signal})`;
    return `exited ${p.exit.code}`;
  }

  async function signal(p, sig) {
    try {
      await api('POST', sandboxPath(id, `/processes/${p.id}/signal`), { json: { signal: sig } });
      toast(`${sig} sent to process ${p.id}`);
    } catch (err) {
      toast(`signal: ${err.message}`, 'error');
    }
    refresh();
  }

  /** Streams process `p`'s output from the start into the viewer until its end. */
  async function show(p) {
    if (reading) reading.abort();
    const ctl = new AbortController();
    reading = ctl;
    const out = h('pre', { class: 'output', 'aria-live': 'polite' });
    const status = h('p', { class: 'empty' }, 'Reading…');
    put(viewer, h('div', { class: 'bar' }, h('h3', {}, `Output of process ${p.id}: ${p.argv.join(' ')}`),
      h('button', { type: 'button', onclick: () => { ctl.abort(); viewer.replaceChildren(); } }, 'Close')),
    out, status);
    try {
      const r = await api('GET', sandboxPath(id, `/processes/${p.id}/output`), { raw: true, headers: { Accept: 'application/x-ndjson' }, signal: ctl.signal });
      const reader = r.body.getReader();
      const text = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += text.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (!line.trim()) continue;
          const ev = JSON.parse(line);
          if (ev.type === 'stdout' || ev.type === 'stderr') {
            out.append(h('span', { class: ev.type }, decoded(ev.data)));
          } else if (ev.type === 'exit') {
            put(status, `Ended: ${exitText({ exit: ev.exit })}.`);
          } else if (ev.type === 'attached') {
            put(status, ev.stdout_from || ev.stderr_from
              ? `Following from byte ${ev.stdout_from} of stdout and ${ev.stderr_from} of stderr (earlier output is no longer kept).`
              : 'Following from the start.');
          } else if (ev.type === 'error') {
            put(status, h('span', { class: 'error' }, ev.error.message));
          }
        }
      }
    } catch (err) {
      if (err.name !== 'AbortError') put(status, h('span', { class: 'error' }, err.message));
    }
  }

  async function refresh() {
    clearTimeout(timer);
    if (stateOf() !== 'running') {
      // A paused sandbox's processes are not asked for (that would resume it, or
      // be refused): said once it is known.
      if (stateOf()) put(list, h('p', { class: 'empty' }, 'Processes are listed while the sandbox runs.'));
      if (!stopped) timer = setTimeout(refresh, 1000);
      return;
    }
    try {
      const ps = (await api('GET', sandboxPath(id, '/processes'))).processes;
      refill(list, table('Processes', ['Id', 'Pid', 'Command', 'Tag', 'Started', 'State', ''],
        ps.slice().reverse().map((p) => ({
          attrs: { 'data-process': String(p.id) },
          cells: [String(p.id), String(p.pid), p.argv.join(' '), p.tag || '', time(p.started_at), exitText(p),
            h('span', { class: 'actions' },
              h('button', { type: 'button', onclick: () => show(p) }, 'Output'),
              p.state === 'running' ? h('button', { type: 'button', onclick: () => signal(p, 'TERM') }, 'Stop') : null,
              p.state === 'running' ? h('button', { type: 'button', class: 'danger', onclick: () => signal(p, 'KILL') }, 'Kill') : null)],
        })), 'No processes.'));
    } catch (err) {
      put(list, h('p', { class: 'error' }, `Processes: ${err.message}`));
    }
    if (!stopped) timer = setTimeout(refresh, 3000);
  }
  cleanups.push(() => { stopped = true; clearTimeout(timer); if (reading) reading.abort(); });
  refresh();
  return h('section', { 'aria-labelledby': 'procs-h' }, h('h2', { id: 'procs-h' }, 'Processes'), list, viewer);
}
