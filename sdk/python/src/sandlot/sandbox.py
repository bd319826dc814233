"""The synchronous API: ``Sandbox``, ``Process``, ``Files``."""

from __future__ import annotations

import codecs
import collections
import contextlib
import json
import os
import tarfile
import tempfile
import threading
import time
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
from ._tarsafe import extract_tar
from .client import Client, default_client
from .models import (
    ExitStatus,
    FileInfo,
    OutputChunk,
    ProcessInfo,
    RunResult,
    SandboxEvent,
    SandboxInfo,
    TarResult,
    Usage,
    WatchEvent,
    decode_chunk,
)

Data = Union[bytes, bytearray, memoryview, str]
Callback = Callable[[str], Any]

_CHUNK = 256 * 1024
_RECONNECTS = 3


class _Pipe:
    """Output of one stream, fed by the reader thread, consumed by the user."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._chunks: Deque[Any] = collections.deque()
        self._closed = False
        self._error: Optional[BaseException] = None

    def feed(self, b: Any) -> None:
        with self._cond:
            self._chunks.append(b)
            self._cond.notify_all()

    def close(self, error: Optional[BaseException] = None) -> None:
        with self._cond:
            self._closed = True
            self._error = error
            self._cond.notify_all()

    def read_chunk(self) -> Any:
        with self._cond:
            while not self._chunks and not self._closed:
                self._cond.wait()
            if self._chunks:
                return self._chunks.popleft()
            if self._error is not None:
                raise self._error
            return None


class OutputStream:
    """A process's stdout or stderr. Iterating yields text lines (with their
    ``\\n``); ``iter_bytes()`` yields raw chunks; ``read()``/``read_bytes()`` read
    to the end. Output not consumed is buffered in this process."""

    def __init__(self, pipe: _Pipe, start: Callable[[], None], name: str) -> None:
        self._pipe = pipe
        self._start = start
        self.name = name

    def iter_bytes(self) -> Iterator[bytes]:
        self._start()
        while True:
            b = self._pipe.read_chunk()
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
    """A process in a sandbox. Its output is read by a background thread as soon
    as it is needed (for a foreground exec: at once), so the process never blocks
    on a full pipe; ``stdout``/``stderr`` hand it out, ``wait()`` returns the exit."""

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
        self._pipes = {"stdout": _Pipe(), "stderr": _Pipe()}
        self._merged = _Pipe()
        # Output is read either per stream (stdout/stderr) or merged (iter_output);
        # until the first reader chooses, it waits here in arrival order.
        self._mode: Optional[str] = None
        self._pending: List[OutputChunk] = []
        self._mode_lock = threading.Lock()
        self._offsets = {"stdout": from_offsets[0], "stderr": from_offsets[1]}
        self._exit: Optional[ExitStatus] = info.exit
        self._exited = threading.Event()
        self._done = threading.Event()
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._closing = False
        self._resp_ctx: Optional[contextlib.ExitStack] = None
        self._resp: Optional[httpx.Response] = None
        self.stdin: Optional[Stdin] = Stdin(self) if info.stdin else None

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
        return OutputStream(self._pipes["stdout"], self._start_split, "stdout")

    @property
    def stderr(self) -> OutputStream:
        return OutputStream(self._pipes["stderr"], self._start_split, "stderr")

    def _start_split(self) -> None:
        self._choose("split")
        self._ensure_reader()

    def _choose(self, mode: str) -> None:
        with self._mode_lock:
            if self._mode is None:
                self._mode = mode
                for c in self._pending:
                    self._route(c)
                self._pending.clear()
            elif self._mode != mode:
                raise RuntimeError(
                    "a process's output is read either through stdout/stderr or through iter_output(), not both"
                )

    def _route(self, c: OutputChunk) -> None:
        if self._mode == "split":
            self._pipes[c.stream].feed(c.data)
        else:
            self._merged.feed(c)

    @property
    def exit(self) -> Optional[ExitStatus]:
        return self._exit

    @property
    def returncode(self) -> Optional[int]:
        """The exit code (``-N`` if killed by signal N); None while it runs."""
        return self._exit.returncode if self._exit else None

    # --- output reader -------------------------------------------------------

    def _start_reader(
        self,
        lines: Optional[Iterator[str]],
        ctx: Optional[contextlib.ExitStack],
        resp: Optional[httpx.Response] = None,
    ) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._resp_ctx = ctx
            self._resp = resp
            self._thread = threading.Thread(
                target=self._run_reader, args=(lines,), name=f"sandlot-output-{self.info.id}", daemon=True
            )
            self._thread.start()

    def _ensure_reader(self) -> None:
        if self._thread is None:
            self._start_reader(None, None)

    def _run_reader(self, lines: Optional[Iterator[str]]) -> None:
        err: Optional[BaseException] = None
        try:
            attempts = 0
            while True:
                try:
                    if lines is None:
                        with self._client.stream(
                            "GET",
                            f"{self._base}/output",
                            params={"stdout_from": self._offsets["stdout"], "stderr_from": self._offsets["stderr"]},
                        ) as resp:
                            self._resp = resp
                            if self._closing:
                                break
                            self._consume(resp.iter_lines())
                    else:
                        try:
                            self._consume(lines)
                        finally:
                            lines = None
                            if self._resp_ctx is not None:
                                self._resp_ctx.close()
                    if self._exited.is_set() or self._closing:
                        break
                    # The stream ended without the exit (a proxy or the daemon went
                    # away): re-attach from our offsets; a stopped sandbox answers 409.
                    attempts += 1
                    if attempts > _RECONNECTS:
                        break
                    time.sleep(0.1 * attempts)
                except (httpx.TransportError, errors.SandlotError) as e:
                    if isinstance(e, errors.APIError) or self._closing or self._exited.is_set():
                        raise
                    attempts += 1
                    if attempts > _RECONNECTS:
                        raise
                    time.sleep(0.1 * attempts)  # the connection broke: re-attach from our offsets
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            err = e if not self._closing else None
        finally:
            if err is None and not self._exited.is_set() and not self._closing:
                err = errors.SandlotError(
                    f"the output stream of process {self.info.id} ended before it exited (was the sandbox stopped?)"
                )
            self._error = err
            for name, pipe in self._pipes.items():
                self._flush_callback(name)
                pipe.close(err if not self._exited.is_set() else None)
            self._merged.close(err if not self._exited.is_set() else None)
            self._done.set()
            self._exited.set()

    def _consume(self, lines: Iterable[str]) -> None:
        for line in lines:
            if self._closing:
                return
            if not line:
                continue
            ev = json.loads(line)
            kind = ev.get("type")
            if kind in ("stdout", "stderr"):
                self._deliver(decode_chunk(ev))
            elif kind == "exit":
                self._exit = ExitStatus.from_json(ev.get("exit") or {})
                self._exited.set()
            elif kind == "error":
                raise errors.from_stream_error(ev.get("error") or {})
            elif kind == "attached":
                self._offsets["stdout"] = max(self._offsets["stdout"], int(ev.get("stdout_from", 0)))
                self._offsets["stderr"] = max(self._offsets["stderr"], int(ev.get("stderr_from", 0)))
            elif kind == "started" and "process" in ev:
                self.info = ProcessInfo.from_json(ev["process"])

    def _deliver(self, c: OutputChunk) -> None:
        seen = self._offsets[c.stream]
        data = c.data
        if c.offset + len(data) <= seen:
            return  # already delivered before a re-attach
        if c.offset < seen:
            data = data[seen - c.offset :]
        self._offsets[c.stream] = c.offset + len(c.data)
        chunk = OutputChunk(stream=c.stream, data=data, offset=c.offset + len(c.data) - len(data))
        with self._mode_lock:
            if self._mode is None:
                self._pending.append(chunk)
            else:
                self._route(chunk)
        cb = self._callbacks[c.stream]
        if cb is not None:
            text = self._decoders[c.stream].decode(data)
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
        self._ensure_reader()
        if not self._exited.wait(timeout):
            raise errors.ProcessTimeoutError(
                f"process {self.info.id} ({self.info.argv!r}) still runs after {timeout}s"
            )
        if self._exit is None and isinstance(self._error, errors.GoneError):
            # Its output is no longer retained; the exit status still is.
            self._exit = self._wait_api(deadline)
        if self._exit is None:
            raise self._error or errors.SandlotError(f"process {self.info.id}: no exit status")
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
        if self._exit is None and self._thread is None:
            info = ProcessInfo.from_json(self._client.json("GET", self._base))
            self.info = info
            if info.exit is not None:
                self._exit = info.exit
        return self.returncode

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
        self._choose("merged")
        self._ensure_reader()
        while True:
            c = self._merged.read_chunk()
            if c is None:
                return
            yield c

    def result(self) -> RunResult:
        """Waits for the exit and the end of both streams; the output not consumed yet."""
        self.wait()
        out = self.stdout.read_bytes()
        err = self.stderr.read_bytes()
        assert self._exit is not None
        return RunResult(argv=list(self.info.argv), stdout_bytes=out, stderr_bytes=err, exit=self._exit)

    def close(self) -> None:
        """Stops reading its output and closes the connection (the process keeps
        running; re-attach with ``Sandbox.process(id)``)."""
        self._closing = True
        resp = self._resp
        if resp is not None:
            _interrupt(resp)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


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

    def upload(self, local_path: Union[str, "os.PathLike[str]"], path: str, *, mode: Union[int, str, None] = None) -> int:
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

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} name={self._info.name!r} state={self._info.state!r}>"

    # --- lifecycle -----------------------------------------------------------

    @classmethod
    def create(
        cls,
        image: Optional[str] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        hostname: Optional[str] = None,
        rootfs: Optional[str] = None,
        resources: Optional[Mapping[str, Any]] = None,
        cpus: Optional[float] = None,
        memory: Optional[_spec.Size] = None,
        pids: Optional[int] = None,
        disk: Optional[_spec.Size] = None,
        timeout: Optional[_spec.Duration] = None,
        idle_timeout: Optional[_spec.Duration] = None,
        mounts: Optional[Sequence[Mapping[str, Any]]] = None,
        network: Any = None,
        volumes: Any = None,
        secrets: Any = None,
        name: Optional[str] = None,
        tags: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        spec: Optional[Mapping[str, Any]] = None,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """Creates a sandbox and returns once it runs. Every argument is optional
        and passed as the API takes it (sizes: bytes or ``"512M"``; durations:
        seconds, ``"10m"`` or a timedelta); ``spec`` is a dict of any further API
        fields. A bad value raises ``InvalidSpecError`` naming the field."""
        body = _spec.create_body(
            image=image,
            rootfs=rootfs,
            env=env,
            workdir=workdir,
            user=user,
            hostname=hostname,
            resources=resources,
            cpus=cpus,
            memory=memory,
            pids=pids,
            disk=disk,
            timeout=timeout,
            idle_timeout=idle_timeout,
            mounts=mounts,
            network=network,
            volumes=volumes,
            secrets=secrets,
            name=name,
            tags=tags,
            metadata=metadata,
            spec=spec,
        )
        c = client or default_client()
        return cls(SandboxInfo.from_json(c.json("POST", "/v1/sandboxes", json=body)), c)

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
        (creating, running, stopping); ``"all"``, ``"stopped"`` or a list.
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

    def set_timeout(self, timeout: _spec.Duration) -> SandboxInfo:
        """The sandbox now ends ``timeout`` from now (not past the operator's maximum lifetime)."""
        d = self._client.json("POST", f"/v1/sandboxes/{self.id}/timeout", json={"timeout": _spec.duration(timeout)})
        self._info = SandboxInfo.from_json(d)
        return self._info

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
            args, env=env, cwd=cwd, user=user, pty=pty, timeout=timeout, stdin=want_stdin, tag=tag, background=background
        )
        path = f"/v1/sandboxes/{self.id}/exec"
        if background:
            info = ProcessInfo.from_json(self._client.json("POST", path, json=body))
            proc = Process(self, info, on_stdout=on_stdout, on_stderr=on_stderr)
            if on_stdout or on_stderr:
                proc._ensure_reader()
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
            proc = Process(self, ProcessInfo.from_json(first["process"]), on_stdout=on_stdout, on_stderr=on_stderr)
            proc._start_reader(lines, stack, resp)
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
        e.message += f" (exec takes the argv: exec({', '.join(repr(a) for a in argv[0].split())}); for a shell command line use run({argv[0]!r}))"
