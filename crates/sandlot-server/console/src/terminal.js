// An interactive shell in the sandbox: xterm.js over the API's WebSocket that
// starts a process (`/exec/ws`) with a PTY. Output arrives as binary frames (first
// byte 1 stdout, 2 stderr); keystrokes go as binary frames; resizes as text.
import { socket, sandboxPath } from './api.js';

const SHELL = 'if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi';

/** Opens `uri` from the terminal if it is an http(s) address and the user agrees. */
function openLink(uri) {
  let u;
  try { u = new URL(uri); } catch { return; }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return;
  if (window.confirm(`Open ${u.href} (a link printed in the sandbox) in a new tab?`)) {
    window.open(u.href, '_blank', 'noopener,noreferrer');
  }
}

/** A terminal in `container`; `onEnd` is called once its connection has closed. */
export function openTerminal(container, id, onEnd = () => {}) {
  container.replaceChildren();
  const term = new window.Terminal({
    cursorBlink: true, scrollback: 5000, fontSize: 14,
    // Links a program in the sandbox prints (OSC 8): only http(s), asked first,
    // opened in a tab that cannot reach this one.
    linkHandler: { activate: (_event, uri) => openLink(uri) },
  });
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(container);
  fit.fit();
  const ws = socket(sandboxPath(id, '/exec/ws'));
  ws.binaryType = 'arraybuffer';
  const enc = new TextEncoder();
  ws.onopen = () => {
    ws.send(JSON.stringify({
      argv: ['/bin/sh', '-c', SHELL], pty: { rows: term.rows, cols: term.cols }, stdin: true,
      env: { TERM: 'xterm-256color' }, tag: 'console-terminal',
    }));
    term.focus();
  };
  ws.onmessage = (ev) => {
    if (typeof ev.data === 'string') {
      let msg;
      try { msg = JSON.parse(ev.data); } catch { return; }
      if (msg.type === 'exit') term.write('\r\n[the shell exited]\r\n');
      if (msg.type === 'error') term.write(`\r\n[error: ${msg.error.message}]\r\n`);
      return;
    }
    const b = new Uint8Array(ev.data);
    if (b.length > 1) term.write(b.subarray(1));
  };
  ws.onclose = () => {
    term.write('\r\n[disconnected]\r\n');
    onEnd();
  };
  term.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
  term.onBinary((d) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(Uint8Array.from(d, (c) => c.charCodeAt(0)));
  });
  term.onResize(({ rows, cols }) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', rows, cols }));
  });
  const onResize = () => fit.fit();
  window.addEventListener('resize', onResize);
  return {
    close() {
      window.removeEventListener('resize', onResize);
      ws.onclose = null; // closed on purpose: not an end to report
      ws.close();
      term.dispose();
    },
  };
}
