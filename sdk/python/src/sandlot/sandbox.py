"""The synchronous API: ``Sandbox``, ``Process``, ``Files``."""

from __future__ import annotations

import codecs
import collections
import contextlib
import json
import os
import queue
import tarfile
import tempfile
import threading
import time
import uuid
from datetime import datetime
from typing import (
    IO,
    Any,
    Callable,
    Deque,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

import httpx

from . import _spec, errors
from . import code as _code
from . import _output
from ._tarsafe import extract_tar
from .client import Client, default_client
from .image import Image
from .ports import Ports
from .network import Network
from .models import (
    Checkpoint,
    ExitStatus,
    FileInfo,
    MetricsSample,
    OutputChunk,
    ProcessInfo,
    RunResult,
    SandboxEvent,
    SandboxInfo,
    Snapshot,
    TarResult,
    Usage,
    WatchEvent,
    metrics_params,
)

Data = Union[bytes, bytearray, memoryview, str]
Callback = Callable[[str], Any]

_CHUNK = 256 * 1024
_RECONNECTS = 3


class _Readers:
    """Daemon threads that read output streams in the background, reused (no
    thread start per process); one more is started when none is idle."""

    thread_name = "sandlot-output"

    def __init__(self) -> None:
        self._q: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._q.put(fn)
        if spawn:
            threading.Thread(target=self._work, name=self.thread_name, daemon=True).start()

    def _work(self) -> None:
        while True:
            fn = self._q.get()
            try:
                fn()
            except BaseException:  # noqa: BLE001 - the process records its own errors
                pass
            with self._lock:
                self._idle += 1


_READERS = _Readers()


class OutputStream:
    """A process's stdout or stderr. Iterating yields text lines (with their
    ``\\n``); ``iter_bytes()`` yields raw chunks; ``read()``/``read_bytes()`` read
    to the end. Output not consumed yet is buffered in this process."""

    def __init__(self, proc: "Process", name: str) -> None:
        self._proc = proc
        self.name = name

    def iter_bytes(self) -> Iterator[bytes]:
        self._proc._choose(_output.SPLIT)
        while True:
            b = self._proc._take(self.name)
            if b is None:
                return
            yield b

    def iter_lines(self, keepends: bool = True) -> Iterator[str]:
        buf = b""
        for chunk in self.iter_bytes():
            buf += chunk
            while True:
                i = buf.find(b"\n")
                if i < 0:
                    break
                line, buf = buf[: i + 1], buf[i + 1 :]
                yield _text(line if keepends else line[:-1])
        if buf:
            yield _text(buf)

    def __iter__(self) -> Iterator[str]:
        return self.iter_lines()

    def read_bytes(self) -> bytes:
        return b"".join(self.iter_bytes())

    def read(self) -> str:
        return _text(self.read_bytes())


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


class Stdin:
    """A process's stdin (exec with ``stdin=True``). Writes are streamed to the
    process with back-pressure; ``close()`` sends EOF (``^D`` on a PTY)."""

    def __init__(self, proc: "Process") -> None:
        self._proc = proc
        self.closed = False

    def write(self, data: Data) -> int:
        b = _spec.stdin_bytes(data)
        if self.closed:
            raise ValueError("write to a closed stdin")
        # While this blocks, the process's output must keep flowing.
        self._proc._ensure_background()
        self._proc._client.request("POST", f"{self._proc._base}/stdin", content=b)
        return len(b)

    def close(self) -> None:
        if self.closed:
            return
        self._proc._client.request("POST", f"{self._proc._base}/stdin/close")
        self.closed = True

    def __enter__(self) -> "Stdin":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Process:
    """A process in a sandbox. Its output stream is read by whichever thread needs
    it (iterating ``stdout``/``stderr``, ``wait()``), without a hand-off; a
    background thread takes over whenever something must not stall it (stdin
    writes, callbacks, ``wait(timeout=...)``). Output not consumed yet is buffered."""

    def __init__(
        self,
        sandbox: "Sandbox",
        info: ProcessInfo,
        *,
        on_stdout: Optional[Callback] = None,
        on_stderr: Optional[Callback] = None,
        from_offsets: "tuple[int, int]" = (0, 0),
    ) -> None:
        self.sandbox = sandbox
        self.info = info
        self._client = sandbox._client
        self._base = f"/v1/sandboxes/{sandbox.id}/processes/{info.id}"
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._decoders = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in ("stdout", "stderr")}
        # Everything below is guarded by _cv.
        self._cv = threading.Condition()
        self._bufs: Dict[str, Deque[Any]] = {
            "stdout": collections.deque(),
            "stderr": collections.deque(),
            "merged": collections.deque(),
        }
        # Output is read either per stream (stdout/stderr) or merged (iter_output);
        # until the first reader chooses, it waits in arrival order.
        self._out = _output.OutputState(from_offsets)
        self._exit: Optional[ExitStatus] = info.exit
        self._exit_seen = info.exit is not None
        self._ended = False
        self._error: Optional[BaseException] = None
        self._reading = False
        self._bg = False
        self._bg_done = threading.Event()
        self._closing = False
        self._lines: Optional[Iterator[str]] = None
        self._stack: Optional[contextlib.ExitStack] = None
        self._resp: Optional[httpx.Response] = None
        self._attempts = 0
        self.stdin: Optional[Stdin] = Stdin(self) if info.stdin else None
        if on_stdout is not None or on_stderr is not None:
            self._ensure_background()

    def __repr__(self) -> str:
        return f"<Process {self.info.id} pid={self.info.pid} argv={self.info.argv!r} returncode={self.returncode}>"

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def pid(self) -> int:
        return self.info.pid

    @property
    def stdout(self) -> OutputStream:
        return OutputStream(self, "stdout")

    @property
    def stderr(self) -> OutputStream:
        return OutputStream(self, "stderr")

    @property
    def exit(self) -> Optional[ExitStatus]:
        return self._exit

    @property
    def returncode(self) -> Optional[int]:
        """The exit code (``-N`` if killed by signal N); None while it runs."""
        return self._exit.returncode if self._exit_seen and self._exit is not None else None

    # --- the output stream ----------------------------------------------------

    def _adopt(self, lines: Iterator[str], stack: contextlib.ExitStack, resp: httpx.Response) -> None:
        """Takes over an already open exec stream (its ``started`` line consumed)."""
        self._lines, self._stack, self._resp = lines, stack, resp

    def _choose(self, mode: str) -> None:
        with self._cv:
            for c in self._out.choose(mode):
                self._route(c)

    def _route(self, c: OutputChunk) -> None:
        if self._out.mode == _output.SPLIT:
            self._bufs[c.stream].append(c.data)
        else:
            self._bufs["merged"].append(c)

    def _take(self, buf: str) -> Any:
        """The next chunk of ``buf``, None at its end; raises the stream's error."""
        q = self._bufs[buf]
        self._pump_until(lambda: bool(q))
        with self._cv:
            if q:
                return q.popleft()
            if self._error is not None:
                raise self._error
            return None

    def _pump_until(self, pred: Callable[[], bool], timeout: Optional[float] = None) -> bool:
        """Reads the stream (here, or by waiting for the thread reading it) until
        ``pred()`` holds or the stream ended. False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while not pred() and not self._ended:
                if not self._reading and not self._bg and deadline is None:
                    self._reading = True
                    self._cv.release()
                    try:
                        self._step()
                    finally:
                        self._cv.acquire()
                        self._reading = False
                        self._cv.notify_all()
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def _ensure_background(self) -> None:
        with self._cv:
            if self._bg or self._ended:
                return
            self._bg = True
        _READERS.submit(self._background)

    def _background(self) -> None:
        try:
            with self._cv:
                while not self._ended:
                    if self._reading:  # a consumer is mid-line: it notifies when done
                        self._cv.wait()
                        continue
                    self._reading = True
                    self._cv.release()
                    try:
                        self._step()
                    finally:
                        self._cv.acquire()
                        self._reading = False
                        self._cv.notify_all()
        finally:
            self._bg_done.set()

    def _step(self) -> None:
        """Reads and dispatches one line (opening or re-opening the stream as
        needed); marks the stream ended at its end or on an error. Called by one
        thread at a time, without the lock."""
        try:
            if self._lines is None:
                self._open()
            assert self._lines is not None
            try:
                line = next(self._lines)
            except StopIteration:
                self._close_source()
                if self._exit_seen or self._closing:
                    self._finish(None)
                else:
                    # Ended without the exit (a proxy or the daemon went away):
                    # re-attach from our offsets; a stopped sandbox answers 409.
                    self._retry(None)
                return
            self._dispatch(line)
        except (httpx.TransportError, httpx.StreamError, errors.SandlotError) as e:
            self._close_source()
            if self._closing:
                self._finish(None)
            elif isinstance(e, errors.APIError) or self._exit_seen:
                self._finish(e)
            else:
                self._retry(e)
        except (KeyboardInterrupt, SystemExit):
            # Interrupted mid-read: the connection is unusable, the process is
            # not; the next read re-attaches from the offsets received.
            self._close_source()
            raise
        except BaseException as e:
            self._close_source()
            self._finish(e)
            raise

    def _open(self) -> None:
        stack = contextlib.ExitStack()
        try:
            resp = stack.enter_context(
                self._client.stream(
                    "GET",
                    f"{self._base}/output",
                    params=self._out.params(),
                )
            )
        except BaseException:
            stack.close()
            raise
        self._lines, self._stack, self._resp = resp.iter_lines(), stack, resp

    def _close_source(self) -> None:
        stack, self._stack, self._lines, self._resp = self._stack, None, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                stack.close()

    def _retry(self, e: Optional[BaseException]) -> None:
        self._attempts += 1
        if self._attempts > _RECONNECTS:
            self._finish(e)
        else:
            time.sleep(0.1 * self._attempts)

    def _finish(self, e: Optional[BaseException]) -> None:
        if e is None and not self._exit_seen and not self._closing:
            e = errors.SandlotError(
                f"the output stream of process {self.info.id} ended before it exited (was the sandbox stopped?)"
            )
        for name in ("stdout", "stderr"):
            self._flush_callback(name)
        with self._cv:
            self._error = None if self._closing else e
            self._ended = True
            self._cv.notify_all()

    def _dispatch(self, line: str) -> None:
        with self._cv:
            ev = self._out.event(line)
            if isinstance(ev, OutputChunk):
                if not self._out.hold(ev):
                    self._route(ev)
                self._cv.notify_all()
            elif isinstance(ev, _output.Exited):
                self._exit = ev.status
                self._exit_seen = True
                self._cv.notify_all()
            elif isinstance(ev, _output.Started):
                self.info = ev.info
        if isinstance(ev, OutputChunk):
            cb = self._callbacks[ev.stream]
            if cb is not None:
                text = self._decoders[ev.stream].decode(ev.data)
                if text:
                    cb(text)

    def _flush_callback(self, name: str) -> None:
        cb = self._callbacks[name]
        if cb is not None:
            rest = self._decoders[name].decode(b"", final=True)
            if rest:
                with contextlib.suppress(Exception):
                    cb(rest)

    # --- control -------------------------------------------------------------

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the exit and returns the return code. Raises
        ``ProcessTimeoutError`` if ``timeout`` seconds pass first (it keeps running)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if timeout is not None:
            self._ensure_background()
        if not self._pump_until(lambda: self._exit_seen, timeout):
            raise errors.ProcessTimeoutError(
                f"process {self.info.id} ({self.info.argv!r}) still runs after {timeout}s"
            )
        if not self._exit_seen and isinstance(self._error, errors.GoneError):
            # Its output is no longer retained; the exit status still is.
            self._exit = self._wait_api(deadline)
            self._exit_seen = True
        if not self._exit_seen or self._exit is None:
            raise self._error or errors.SandlotError(f"process {self.info.id}: no exit status")
        if not self._ended:
            # Read the rest (output of descendants, the end of the stream) in the
            # background, so the connection goes back to the pool once it ends.
            self._ensure_background()
        return self._exit.returncode

    def _wait_api(self, deadline: Optional[float]) -> ExitStatus:
        while True:
            left = 3600.0 if deadline is None else max(0.0, deadline - time.monotonic())
            r = self._client.json(
                "GET", f"{self._base}/wait", params={"timeout": f"{max(left, 0.001):.3f}"}, timeout=left + 30
            )
            if r.get("exited") and r.get("exit"):
                return ExitStatus.from_json(r["exit"])
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.ProcessTimeoutError(f"process {self.info.id} ({self.info.argv!r}) still runs")

    def poll(self) -> Optional[int]:
        """The return code if it has exited, else None (never blocks)."""
        if self._exit_seen:
            return self.returncode
        info = ProcessInfo.from_json(self._client.json("GET", self._base))
        self.info = info
        return info.exit.returncode if info.exit is not None else None

    def refresh(self) -> ProcessInfo:
        self.info = ProcessInfo.from_json(self._client.json("GET", self._base))
        return self.info

    def signal(self, sig: Union[str, int]) -> None:
        """Sends a signal (``"TERM"``, ``"SIGINT"``, ``9``) to its process group."""
        self._client.request("POST", f"{self._base}/signal", json={"signal": sig})

    def terminate(self) -> None:
        self.signal("TERM")

    def kill(self) -> None:
        self.signal("KILL")

    def resize(self, rows: int, cols: int) -> None:
        """Resizes its PTY."""
        self._client.request("POST", f"{self._base}/resize", json={"rows": rows, "cols": cols})

    def iter_output(self) -> Iterator[OutputChunk]:
        """Stdout and stderr chunks in arrival order (instead of ``stdout``/``stderr``)."""
        self._choose(_output.MERGED)
        while True:
            c = self._take("merged")
            if c is None:
                return
            yield c

    def result(self) -> RunResult:
        """Waits for the exit and the end of both streams; the output not consumed
        yet (after ``iter_output()``, what it has not yielded)."""
        self.wait()
        if self._out.mode == _output.MERGED:
            rest: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
            while True:
                c = self._take("merged")
                if c is None:
                    break
                rest[c.stream] += c.data
            out, err = bytes(rest["stdout"]), bytes(rest["stderr"])
        else:
            out = self.stdout.read_bytes()
            err = self.stderr.read_bytes()
        assert self._exit is not None
        return RunResult(argv=list(self.info.argv), stdout_bytes=out, stderr_bytes=err, exit=self._exit)

    def close(self) -> None:
        """Stops reading its output and closes the connection (the process keeps
        running; re-attach with ``Sandbox.process(id)``)."""
        with self._cv:
            self._closing = True
            resp = self._resp
            reading = self._reading
        if resp is not None:
            _interrupt(resp)
        if not reading:
            self._close_source()
            self._finish(None)
        if self._bg and threading.current_thread().name != _READERS.thread_name:
            self._bg_done.wait(timeout=5)


def _interrupt(resp: httpx.Response) -> None:
    """Ends a streamed response another thread may be blocked reading: shuts the
    socket down (which wakes a blocked recv; closing alone would not)."""
    import socket

    stream = resp.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        resp.close()


class Files:
    """File operations in a sandbox (paths are absolute paths in the sandbox)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox
        self._client = sandbox._client
        self._base = f"/v1/sandboxes/{sandbox.id}/files"

    def read(self, path: str, *, offset: Optional[int] = None, length: Optional[int] = None) -> bytes:
        """The file's bytes (or ``length`` bytes from ``offset``)."""
        return b"".join(self.iter_read(path, offset=offset, length=length))

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read(path).decode(encoding, errors)

    def iter_read(
        self, path: str, *, offset: Optional[int] = None, length: Optional[int] = None, chunk_size: int = _CHUNK
    ) -> Iterator[bytes]:
        """The file's bytes, streamed in chunks."""
        params: Dict[str, Any] = {"path": path}
        if offset is not None:
            params["offset"] = offset
        if length is not None:
            params["length"] = length
        with self._client.stream("GET", self._base, params=params) as resp:
            yield from resp.iter_bytes(chunk_size)

    def download(self, path: str, local_path: Union[str, "os.PathLike[str]"]) -> int:
        """Streams a file of the sandbox to a local file; returns its size."""
        n = 0
        tmp = f"{os.fspath(local_path)}.sandlot-partial"
        try:
            with open(tmp, "wb") as f:
                for chunk in self.iter_read(path):
                    f.write(chunk)
                    n += len(chunk)
            os.replace(tmp, local_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return n

    def write(
        self,
        path: str,
        data: Union[Data, IO[bytes], Iterable[bytes]],
        *,
        mode: Union[int, str, None] = None,
        append: bool = False,
    ) -> int:
        """Writes a file (parent directories are created; it appears atomically
        when complete). ``data``: bytes, str (UTF-8), a binary file object or an
        iterable of bytes (streamed). Returns the bytes written."""
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = _spec.mode_str(mode)
        if append:
            params["append"] = "true"
        r = self._client.json("PUT", self._base, params=params, content=_body(data))
        return int(r.get("bytes", 0))

    def write_text(self, path: str, text: str, *, encoding: str = "utf-8", mode: Union[int, str, None] = None) -> int:
        return self.write(path, text.encode(encoding), mode=mode)

    def upload(
        self, local_path: Union[str, "os.PathLike[str]"], path: str, *, mode: Union[int, str, None] = None
    ) -> int:
        """Streams a local file into the sandbox (mode: the local file's, unless given)."""
        if mode is None:
            mode = os.stat(local_path).st_mode & 0o7777
        with open(local_path, "rb") as f:
            return self.write(path, f, mode=mode)

    def stat(self, path: str, *, follow: bool = False) -> FileInfo:
        params: Dict[str, Any] = {"path": path}
        if follow:
            params["follow"] = "true"
        return FileInfo.from_json(self._client.json("GET", f"{self._base}/stat", params=params))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except errors.NotFoundError:
            return False

    def list(self, path: str, *, depth: int = 1) -> List[FileInfo]:
        """Entries under a directory, to ``depth`` levels (each with its ``depth``)."""
        r = self._client.json("GET", f"{self._base}/list", params={"path": path, "depth": depth})
        return [FileInfo.from_json(e) for e in r.get("entries", [])]

    def mkdir(self, path: str, *, parents: bool = False, mode: Union[int, str, None] = None) -> None:
        body: Dict[str, Any] = {"path": path, "parents": parents}
        if mode is not None:
            body["mode"] = _spec.mode_str(mode)
        self._client.request("POST", f"{self._base}/mkdir", json=body)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        params: Dict[str, Any] = {"path": path}
        if recursive:
            params["recursive"] = "true"
        self._client.request("DELETE", self._base, params=params)

    def rename(self, src: str, dst: str, *, overwrite: bool = True) -> None:
        self._client.request("POST", f"{self._base}/rename", json={"from": src, "to": dst, "overwrite": overwrite})

    def watch(self, path: str, *, recursive: bool = False) -> "Watch":
        """Watches a path: iterate the returned ``Watch`` for ``WatchEvent``s; close
        it (or use ``with``) to stop. Events after this call returns are seen."""
        params: Dict[str, Any] = {"path": path}
        if recursive:
            params["recursive"] = "true"
        stack = contextlib.ExitStack()
        resp = stack.enter_context(self._client.stream("GET", f"{self._base}/watch", params=params))
        return Watch(resp, stack)

    def upload_dir(self, local_dir: Union[str, "os.PathLike[str]"], path: str) -> TarResult:
        """Copies a local directory tree into ``path`` (created) as a tar stream.
        Symlinks and special files are skipped by the daemon (listed in ``skipped``)."""
        with tempfile.TemporaryFile() as tmp:
            with tarfile.open(fileobj=tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
                tar.add(os.fspath(local_dir), arcname=".")
            tmp.seek(0)
            r = self._client.json(
                "PUT",
                f"{self._base}/tar",
                params={"path": path},
                content=_file_chunks(tmp),
                headers={"content-type": "application/x-tar"},
            )
        return TarResult.from_json(r)

    def download_dir(self, path: str, local_dir: Union[str, "os.PathLike[str]"]) -> List[str]:
        """Copies a directory of the sandbox into ``local_dir`` (created); returns
        the member names. Entries escaping ``local_dir`` are refused."""
        os.makedirs(local_dir, exist_ok=True)
        with tempfile.TemporaryFile() as tmp:
            with self._client.stream("GET", f"{self._base}/tar", params={"path": path}) as resp:
                for chunk in resp.iter_bytes(_CHUNK):
                    tmp.write(chunk)
            tmp.seek(0)
            return extract_tar(tmp, os.fspath(local_dir))


def _file_chunks(f: IO[bytes]) -> Iterator[bytes]:
    while True:
        b = f.read(_CHUNK)
        if not b:
            return
        yield b


def _body(data: Any) -> Any:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        return _file_chunks(data)
    if isinstance(data, Iterable):
        return (bytes(b) for b in data)
    raise TypeError(f"file data is bytes, str, a binary file or an iterable of bytes, not {type(data).__name__}")


class Watch:
    """A stream of filesystem events; iterate it, close it when done."""

    def __init__(self, resp: httpx.Response, stack: contextlib.ExitStack) -> None:
        self._resp = resp
        self._lines = resp.iter_lines()
        self._stack = stack

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        while True:
            try:
                line = next(self._lines)
            except (httpx.TransportError, httpx.StreamError) as e:
                raise StopIteration from e
            if line:
                ev = json.loads(line)
                if ev.get("type") == "error":
                    raise errors.from_stream_error(ev.get("error") or {})
                return WatchEvent.from_json(ev)

    def close(self) -> None:
        """Stops watching (also from another thread blocked iterating it)."""
        _interrupt(self._resp)
        with contextlib.suppress(Exception):
            self._stack.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Sandbox:
    """A sandbox. Create one with ``Sandbox.create()``, reach an existing one with
    ``Sandbox.connect(id_or_name)``. As a context manager it is terminated on exit."""

    def __init__(self, info: SandboxInfo, client: Client) -> None:
        self._info = info
        self._client = client
        self.id = info.id
        self.files = Files(self)
        #: Inbound traffic: ``ports[8000].url`` (the proxy), ``ports.publish(8000)``.
        self.ports = Ports(client, info.id)
        #: Egress: ``network.get()``, ``network.set(allow=[...])``, ``network.log()``.
        self.network = Network(client, info.id)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} name={self._info.name!r} state={self._info.state!r}>"

    # --- lifecycle -----------------------------------------------------------

    @classmethod
    def create(
        cls,
        image: Union[str, "Image", Mapping[str, Any], None] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        hostname: Optional[str] = None,
        isolation: Optional[str] = None,
        rootfs: Optional[str] = None,
        resources: Optional[Mapping[str, Any]] = None,
        cpus: Optional[float] = None,
        memory: Optional[_spec.Size] = None,
        pids: Optional[int] = None,
        disk: Optional[_spec.Size] = None,
        timeout: Optional[_spec.Duration] = None,
        idle_timeout: Optional[_spec.Duration] = None,
        on_idle: Optional[_spec.OnExpiry] = None,
        on_timeout: Optional[_spec.OnExpiry] = None,
        auto_resume: Optional[bool] = None,
        mounts: Optional[Sequence[Mapping[str, Any]]] = None,
        network: Any = None,
        public_ports: Optional[bool] = None,
        volumes: Any = None,
        secrets: Any = None,
        name: Optional[str] = None,
        tags: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        spec: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """Creates a sandbox and returns once it runs. Every argument is optional
        and passed as the API takes it (sizes: bytes or ``"512M"``; durations:
        seconds, ``"10m"`` or a timedelta); ``spec`` is a dict of any further API
        fields. ``image`` is a name or id, an :class:`Image`, or an image as the
        API returns it (what :meth:`snapshot_filesystem` returns). A bad value
        raises ``InvalidSpecError`` naming the field.
        ``isolation``: ``"namespace"`` (Linux namespaces on the host kernel) or
        ``"gvisor"`` (gVisor's kernel in user space); default: the operator's.
        A daemon that cannot run gVisor answers ``ConflictError`` naming why.
        ``on_idle``/``on_timeout``: ``"pause"`` pauses the sandbox when its idle
        or lifetime timeout passes instead of ending it (default ``"kill"``);
        ``auto_resume``: exec, file, code and port calls on it while paused
        resume it first (without, they raise ``ConflictError``).
        ``network``: a mode (``"open"``) or a policy dict, e.g. ``{"mode": "open",
        "deny": [{"cidr": "203.0.113.0/24"}, {"domain": "*.example.com"}]}``.
        ``public_ports``: the sandbox's ports answer host-name URLs
        (``PORT-ID.DOMAIN``) without a credential (never 49983 or 49999); an
        operator who forbids it answers ``InvalidSpecError`` naming ``ports.public``.
        ``idempotency_key`` (default: a fresh random one) makes the create safe
        to retry: the daemon answers a repeat with the sandbox the first made."""
        c = client or default_client()
        if isinstance(image, Image):
            # Built (or pulled) through the API on first use; cached afterwards.
            image = image.build(client=c)
        body = _spec.create_body(
            image=image,
            rootfs=rootfs,
            env=env,
            workdir=workdir,
            user=user,
            hostname=hostname,
            isolation=isolation,
            resources=resources,
            cpus=cpus,
            memory=memory,
            pids=pids,
            disk=disk,
            timeout=timeout,
            idle_timeout=idle_timeout,
            on_idle=on_idle,
            on_timeout=on_timeout,
            auto_resume=auto_resume,
            mounts=mounts,
            network=network,
            public_ports=public_ports,
            volumes=volumes,
            secrets=secrets,
            name=name,
            tags=tags,
            metadata=metadata,
            spec=spec,
        )
        # The key makes a retry of a create whose answer was lost (a dropped
        # connection) return the same sandbox instead of making a second one.
        key = idempotency_key or uuid.uuid4().hex
        info = c.json("POST", "/v1/sandboxes", json=body, headers={"Idempotency-Key": key})
        return cls(SandboxInfo.from_json(info), c)

    @classmethod
    def connect(cls, id_or_name: str, *, client: Optional[Client] = None) -> "Sandbox":
        """An existing sandbox, by id or name (``NotFoundError`` if the caller cannot see it)."""
        c = client or default_client()
        return cls(c.get_sandbox(id_or_name), c)

    from_id = connect

    @classmethod
    def list(
        cls,
        *,
        tags: Union[Mapping[str, Optional[str]], Iterable[str], None] = None,
        state: Union[str, Iterable[str], None] = None,
        name: Optional[str] = None,
        limit: Optional[int] = None,
        client: Optional[Client] = None,
    ) -> List["Sandbox"]:
        """Sandboxes of the caller, newest first. ``state``: default live
        (every state but stopped, paused included); ``"all"``, ``"stopped"``,
        ``"paused"`` or a list.
        ``tags``: ``{"k": "v"}`` must match; ``{"k": None}`` or ``["k"]``: has tag k."""
        c = client or default_client()
        r = c.json("GET", "/v1/sandboxes", params=_spec.list_params(tags, state, name, limit))
        return [cls(SandboxInfo.from_json(d), c) for d in r.get("sandboxes", [])]

    def refresh(self) -> SandboxInfo:
        """Fetches the current state and returns it."""
        self._info = self._client.get_sandbox(self.id)
        return self._info

    @property
    def info(self) -> SandboxInfo:
        """The last known state (``refresh()`` fetches a new one)."""
        return self._info

    @property
    def name(self) -> Optional[str]:
        return self._info.name

    @property
    def state(self) -> str:
        return self._info.state

    @property
    def tags(self) -> Dict[str, str]:
        return self._info.tags

    @property
    def metadata(self) -> Dict[str, str]:
        return self._info.metadata

    def usage(self) -> Usage:
        """Current usage (CPU seconds, memory, bytes in and out)."""
        return self.refresh().usage

    def events(self, after: int = 0) -> List[SandboxEvent]:
        r = self._client.json("GET", f"/v1/sandboxes/{self.id}/events", params={"after": after})
        return [SandboxEvent.from_json(e) for e in r.get("events", [])]

    def metrics(self, start: Optional[datetime] = None, end: Optional[datetime] = None) -> List[MetricsSample]:
        """CPU and memory over time, oldest first: a sample every 5 seconds while
        the sandbox is young (coarser as it ages: the whole life is kept in a
        bounded history), ending with one taken now when the range reaches the
        present. Empty while it does not run; a pause or a daemon restart starts a
        new history."""
        r = self._client.json("GET", f"/v1/sandboxes/{self.id}/metrics", params=metrics_params(start, end))
        return [MetricsSample.from_json(x) for x in r.get("samples", [])]

    def set_timeout(self, timeout: _spec.Duration) -> SandboxInfo:
        """The sandbox now ends ``timeout`` from now (not past the operator's maximum lifetime)."""
        d = self._client.json("POST", f"/v1/sandboxes/{self.id}/timeout", json={"timeout": _spec.duration(timeout)})
        self._info = SandboxInfo.from_json(d)
        return self._info

    def pause(self) -> SandboxInfo:
        """Pauses the sandbox: nothing of it runs (it holds no memory and no CPU)
        until :meth:`resume`. On gVisor its memory is saved (``info.pause ==
        "memory"``): every process, open file and socket inside comes back as it
        was, after a daemon restart too. On the namespace backend only its files are
        (``"filesystem"``): its processes end, and a resume starts it again from the
        same files. Connections from outside (streams, ports) are cut; code
        contexts end. The lifetime clock stops while it is paused. A sandbox that
        is not running raises :class:`~sandlot.errors.InvalidStateError`; one gVisor
        cannot save as it is, :class:`~sandlot.errors.PauseRefusedError` (it runs
        on)."""
        d = self._client.json("POST", f"/v1/sandboxes/{self.id}/pause")
        self._info = SandboxInfo.from_json(d)
        return self._info

    @classmethod
    def resume(cls, id_or_name: str, *, client: Optional[Client] = None) -> "Sandbox":
        """Starts paused sandbox ``id_or_name`` again from what its pause saved and
        returns it. One that is not paused raises
        :class:`~sandlot.errors.InvalidStateError`; a damaged memory image,
        :class:`~sandlot.errors.CheckpointDamagedError` (it stays paused)."""
        c = client or default_client()
        d = c.json("POST", f"/v1/sandboxes/{id_or_name}/resume")
        return cls(SandboxInfo.from_json(d), c)

    # --- checkpoints and forks ------------------------------------------------

    def checkpoint(self, name: Optional[str] = None, *, leave_running: bool = True) -> Checkpoint:
        """Saves the sandbox's state as a checkpoint and returns it. On gVisor it
        holds the memory, processes and files (``kind == "memory"``): the sandbox
        is paused, saved and resumed, which costs about a pause and a resume, and
        connections from outside are cut as at a pause. On the namespace backend
        it holds the files (``"filesystem"``) and the sandbox runs on untouched.
        With ``leave_running=False`` the sandbox stays paused (:meth:`resume`
        starts it). At most the operator's ``limits.max_checkpoints_per_sandbox``
        (16 by default): more raise :class:`~sandlot.errors.QuotaExceededError`."""
        body: Dict[str, Any] = {"leave_running": leave_running}
        if name is not None:
            body["name"] = name
        d = self._client.json("POST", f"/v1/sandboxes/{self.id}/checkpoints", json=body)
        return Checkpoint.from_json(d)

    def checkpoints(self) -> List[Checkpoint]:
        """The sandbox's checkpoints, oldest first (``parent`` links form a tree)."""
        r = self._client.json("GET", f"/v1/sandboxes/{self.id}/checkpoints")
        return [Checkpoint.from_json(c) for c in r.get("checkpoints", [])]

    def restore(self, checkpoint: Union[str, Checkpoint]) -> SandboxInfo:
        """Restores the sandbox in place to one of its checkpoints: on gVisor its
        processes, memory and files as they were; on the namespace backend its
        files, with its processes started afresh. Returns its new state."""
        cp = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        d = self._client.json("POST", f"/v1/sandboxes/{self.id}/checkpoints/{cp}/restore")
        self._info = SandboxInfo.from_json(d["sandbox"])
        return self._info

    def delete_checkpoint(self, checkpoint: Union[str, Checkpoint]) -> None:
        """Deletes one of the sandbox's checkpoints (sandboxes forked from it run on)."""
        cp = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        self._client.request("DELETE", f"/v1/sandboxes/{self.id}/checkpoints/{cp}")

    def diff_checkpoints(self, a: Union[str, Checkpoint], b: Union[str, Checkpoint]) -> Dict[str, List[str]]:
        """The files that differ from checkpoint ``a`` to checkpoint ``b`` of this
        sandbox: ``{"added": [...], "changed": [...], "removed": [...]}`` (absolute
        paths), by the image diff."""
        ca = a.id if isinstance(a, Checkpoint) else a
        cb = b.id if isinstance(b, Checkpoint) else b
        r = self._client.json(
            "GET", f"/v1/sandboxes/{self.id}/checkpoints/{ca}/diff", params={"against": cb}
        )
        return {k: [str(p) for p in r.get(k, [])] for k in ("added", "changed", "removed")}

    def fork(self, count: int = 1, *, checkpoint: Union[str, Checkpoint, None] = None) -> List["Sandbox"]:
        """Makes ``count`` new sandboxes of the same tenant that continue from a
        fresh checkpoint of this one (or from ``checkpoint``) and returns them.
        Each has its own id, network slot and files. On gVisor they continue the
        checkpoint's processes from their memory; on the namespace backend they
        get its files and start their processes afresh. All of them are made or
        none (:class:`~sandlot.errors.QuotaExceededError` past the tenant's
        quotas)."""
        body: Dict[str, Any] = {"count": count}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        d = self._client.json("POST", f"/v1/sandboxes/{self.id}/fork", json=body)
        return [type(self)(SandboxInfo.from_json(s), self._client) for s in d.get("sandboxes", [])]

    def create_snapshot(
        self, name: Optional[str] = None, *, checkpoint: Union[str, Checkpoint, None] = None
    ) -> Snapshot:
        """Saves the sandbox's state as a snapshot of the tenant's and returns it.
        Unlike a checkpoint it outlives the sandbox (and daemon restarts) until
        :meth:`delete_snapshot`; :meth:`from_snapshot` starts sandboxes from it. It
        is a fresh checkpoint (the sandbox runs on, or stays paused), or
        ``checkpoint``, promoted out of the sandbox. On gVisor it keeps processes
        and memory; on the namespace backend it is files only. Past the tenant's
        ``max_snapshots`` or ``max_saved_disk``:
        :class:`~sandlot.errors.QuotaExceededError`."""
        body: Dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if checkpoint is not None:
            body["checkpoint"] = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        d = self._client.json("POST", f"/v1/sandboxes/{self.id}/snapshots", json=body)
        return Snapshot.from_json(d)

    @classmethod
    def list_snapshots(
        cls,
        *,
        sandbox_id: Optional[str] = None,
        name: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> List[Snapshot]:
        """The caller's snapshots, oldest first (of one sandbox, or of one name)."""
        c = client or default_client()
        params: Dict[str, str] = {}
        if sandbox_id is not None:
            params["sandbox_id"] = sandbox_id
        if name is not None:
            params["name"] = name
        r = c.json("GET", "/v1/snapshots", params=params)
        return [Snapshot.from_json(d) for d in r.get("snapshots", [])]

    @classmethod
    def delete_snapshot(cls, snapshot: Union[str, Snapshot], *, client: Optional[Client] = None) -> None:
        """Deletes one of the caller's snapshots, freeing its disk (``NotFoundError``
        if it has none of that id). Sandboxes started from it run on."""
        c = client or default_client()
        sn = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        c.request("DELETE", f"/v1/snapshots/{sn}")

    @classmethod
    def from_snapshot(
        cls,
        snapshot: Union[str, Snapshot],
        *,
        timeout: Optional[int] = None,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """A new sandbox started from one of the caller's snapshots: on gVisor it
        continues the snapshot's processes from their memory, on the namespace
        backend it has its files and starts afresh. ``timeout``: its lifetime in
        seconds (default: the one the snapshot's sandbox was created with)."""
        c = client or default_client()
        sn = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        body: Dict[str, Any] = {}
        if timeout is not None:
            body["timeout"] = timeout
        d = c.json("POST", f"/v1/snapshots/{sn}/sandboxes", json=body)
        return cls(SandboxInfo.from_json(d), c)

    def snapshot_filesystem(self, tag: Optional[str] = None) -> Dict[str, Any]:
        """Turns the sandbox's writable layer into a new image whose parent is the
        sandbox's image (the sandbox is frozen while the layer is read) and returns
        it (``id``, ``tags``, ``parent``, ``base``, ``layers``, ``frozen_ms``...). New
        sandboxes start from it with ``Sandbox.create(image=snap)`` (or its id or
        tag). A snapshot of a ``host`` sandbox has no parent and ``base: "host"``:
        its layer goes on top of the host's own programs, so it restores on the same
        host (or one with the same programs); a sandbox of a rootfs directory cannot
        be snapshotted. A tenant's ``tag`` is its own (other
        tenants never see it; it hides an operator's tag of the same name for this
        tenant only). A writable layer that reads as more than the sandbox's
        ``resources.disk`` (sparse files count at their full size) is refused with
        :class:`~sandlot.errors.PayloadTooLargeError` and nothing is stored."""
        snap: Dict[str, Any] = self._client.json(
            "POST", f"/v1/sandboxes/{self.id}/snapshot", json={"tag": tag} if tag else {}
        )
        return snap

    def terminate(self) -> SandboxInfo:
        """Stops it: kills everything, removes every trace on the host. Idempotent."""
        self._info = SandboxInfo.from_json(self._client.json("DELETE", f"/v1/sandboxes/{self.id}"))
        return self._info

    kill = terminate

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(errors.NotFoundError):
            self.terminate()

    # --- processes -----------------------------------------------------------

    def exec(
        self,
        *argv: Any,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Union[bool, Data, None] = None,
        pty: Any = None,
        timeout: Optional[_spec.Duration] = None,
        tag: Optional[str] = None,
        background: bool = False,
        on_stdout: Optional[Callback] = None,
        on_stderr: Optional[Callback] = None,
    ) -> Process:
        """Starts ``argv`` and returns its ``Process``. ``stdin=True`` opens its
        stdin (``p.stdin``); bytes or str are written and closed. ``pty=True`` or
        ``(rows, cols)`` gives it a terminal. ``timeout`` kills it after that long.
        ``background=True``: its output is not held for a reader (re-attach later).
        ``on_stdout``/``on_stderr`` receive decoded text as it arrives (from the reader thread)."""
        args = _spec.argv_of(argv)
        want_stdin = stdin is not None and stdin is not False
        body = _spec.exec_body(
            args,
            env=env,
            cwd=cwd,
            user=user,
            pty=pty,
            timeout=timeout,
            stdin=want_stdin,
            tag=tag,
            background=background,
        )
        path = f"/v1/sandboxes/{self.id}/exec"
        if background:
            info = ProcessInfo.from_json(self._client.json("POST", path, json=body))
            proc = Process(self, info, on_stdout=on_stdout, on_stderr=on_stderr)
        else:
            stack = contextlib.ExitStack()
            try:
                resp = stack.enter_context(self._client.stream("POST", path, params={"stream": "ndjson"}, json=body))
                lines = resp.iter_lines()
                first = _first_line(lines)
            except errors.SpawnError as e:
                stack.close()
                _hint_shell(e, args)
                raise
            except BaseException:
                stack.close()
                raise
            proc = Process(self, ProcessInfo.from_json(first["process"]))
            proc._adopt(lines, stack, resp)
            proc._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
            if on_stdout is not None or on_stderr is not None:
                proc._ensure_background()
        if want_stdin and stdin is not True:
            assert proc.stdin is not None
            proc.stdin.write(stdin)  # type: ignore[arg-type]
            proc.stdin.close()
        return proc

    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        check: bool = False,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Data] = None,
        timeout: Optional[_spec.Duration] = None,
    ) -> RunResult:
        """Runs a command to completion: a string goes through ``/bin/sh -c``, a
        list is the argv. Returns stdout, stderr and the exit code; ``check=True``
        raises ``CommandError`` (with the output) unless it exits 0."""
        p = self.exec(*_spec.shell_argv(cmd), env=env, cwd=cwd, user=user, stdin=stdin, timeout=timeout)
        r = p.result()
        if check and r.exit_code != 0:
            raise (errors.CommandTimeoutError if r.exit.timed_out else errors.CommandError)(r)
        return r

    def processes(self) -> List[ProcessInfo]:
        """Processes of this sandbox, finished ones included."""
        r = self._client.json("GET", f"/v1/sandboxes/{self.id}/processes")
        return [ProcessInfo.from_json(p) for p in r.get("processes", [])]

    def process(self, id: int, *, stdout_from: int = 0, stderr_from: int = 0) -> Process:
        """Re-attaches to process ``id`` (e.g. a background one); its output is read
        from the given offsets (default: the start, within what is retained)."""
        info = ProcessInfo.from_json(self._client.json("GET", f"/v1/sandboxes/{self.id}/processes/{id}"))
        return Process(self, info, from_offsets=(stdout_from, stderr_from))

    attach = process

    # --- code contexts -------------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        context: Union[None, str, _code.CodeContext] = None,
        timeout: Optional[_spec.Duration] = None,
        env: Optional[Mapping[str, str]] = None,
        on_stdout: Optional[_code.OnText] = None,
        on_stderr: Optional[_code.OnText] = None,
        on_result: Optional[_code.OnResult] = None,
        on_error: Optional[_code.OnError] = None,
    ) -> _code.Execution:
        """Runs ``code`` in a code context (default: the sandbox's Python context,
        started on first use) and returns its ``Execution``: rich results, stdout,
        stderr, the error. Variables, imports and the working directory stay for
        the next run. The callbacks see output as it happens. ``timeout``
        interrupts the cell (default 300s)."""
        cb = _code.Callbacks(on_stdout, on_stderr, on_result, on_error)
        col = _code.Collector(cb)
        path = f"/v1/sandboxes/{self.id}/contexts/{_code.context_id(context)}/run"
        body = _code.run_body(code, timeout, env)
        with self._client.stream("POST", path, params={"stream": "ndjson"}, json=body) as resp:
            for line in resp.iter_lines():
                col.feed(line)
        return col.result()

    def create_code_context(
        self,
        language: str = "python",
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> _code.CodeContext:
        """Starts a new interpreter (``python``, ``bash``, or ``javascript`` where a
        Jupyter kernel for it is installed) with its own state."""
        d = self._client.json(
            "POST", f"/v1/sandboxes/{self.id}/contexts", json=_code.create_body(language, cwd, env)
        )
        return _code.CodeContext.from_json(d)

    def list_code_contexts(self) -> List[_code.CodeContext]:
        return _code.contexts_of(self._client.json("GET", f"/v1/sandboxes/{self.id}/contexts"))

    def restart_code_context(self, context: Union[str, _code.CodeContext]) -> _code.CodeContext:
        """A new interpreter for the context: its state is lost."""
        d = self._client.json("POST", f"/v1/sandboxes/{self.id}/contexts/{_code.context_id(context)}/restart")
        return _code.CodeContext.from_json(d)

    def interrupt_code(self, context: Union[None, str, _code.CodeContext] = None) -> None:
        """Interrupts the cell the context runs now (``KeyboardInterrupt``; state kept)."""
        self._client.request("POST", f"/v1/sandboxes/{self.id}/contexts/{_code.context_id(context)}/interrupt")

    def remove_code_context(self, context: Union[str, _code.CodeContext]) -> None:
        """Ends the context's interpreter."""
        self._client.request("DELETE", f"/v1/sandboxes/{self.id}/contexts/{_code.context_id(context)}")


def _first_line(lines: Iterator[str]) -> Dict[str, Any]:
    for line in lines:
        if not line:
            continue
        ev = json.loads(line)
        if ev.get("type") == "error":
            raise errors.from_stream_error(ev.get("error") or {})
        if ev.get("type") != "started" or "process" not in ev:
            raise errors.ProtocolError(f"expected a 'started' line, got {line[:200]!r}")
        return dict(ev)
    raise errors.ProtocolError("the exec stream ended before its 'started' line")


def _hint_shell(e: errors.SpawnError, argv: List[str]) -> None:
    """``exec("ls -l")`` looks for a program named "ls -l": say how to run a command line."""
    if len(argv) == 1 and " " in argv[0]:
        split = ", ".join(repr(a) for a in argv[0].split())
        e.message += f" (exec takes the argv: exec({split}); for a shell command line use run({argv[0]!r}))"
