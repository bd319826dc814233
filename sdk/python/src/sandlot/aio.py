"""The asyncio API: ``AsyncSandbox``, ``AsyncProcess``, ``AsyncFiles``, the same
shape as the sync API with ``await`` (and ``async for`` / ``async with``)."""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import inspect
import json
import os
import tarfile
import tempfile
import uuid
from datetime import datetime
from typing import (
    IO,
    Any,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Deque,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

import httpx

from . import _output, _spec, errors
from . import code as _code
from ._tarsafe import extract_tar
from .client import AsyncClient, default_async_client
from .image import Image
from .ports import AsyncPorts
from .network import AsyncNetwork
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
AsyncCallback = Callable[[str], Union[Any, Awaitable[Any]]]

_CHUNK = 256 * 1024
_RECONNECTS = 3


class _AsyncPipe:
    """Output of one stream, fed by the reader task, consumed by the user."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()
        self._chunks: Deque[Any] = collections.deque()
        self._closed = False
        self._error: Optional[BaseException] = None

    def feed(self, b: Any) -> None:
        self._chunks.append(b)
        self._changed.set()

    def close(self, error: Optional[BaseException] = None) -> None:
        self._closed = True
        self._error = error
        self._changed.set()

    async def read_chunk(self) -> Any:
        while not self._chunks and not self._closed:
            self._changed.clear()
            await self._changed.wait()
        if self._chunks:
            return self._chunks.popleft()
        if self._error is not None:
            raise self._error
        return None


class AsyncOutputStream:
    """A process's stdout or stderr: ``async for line in p.stdout`` (text lines with
    their ``\\n``), ``iter_bytes()``, ``await read()`` / ``await read_bytes()``."""

    def __init__(self, pipe: _AsyncPipe, start: Callable[[], None], name: str) -> None:
        self._pipe = pipe
        self._start = start
        self.name = name

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        self._start()
        while True:
            b = await self._pipe.read_chunk()
            if b is None:
                return
            yield b

    async def iter_lines(self, keepends: bool = True) -> AsyncIterator[str]:
        buf = b""
        async for chunk in self.iter_bytes():
            buf += chunk
            while True:
                i = buf.find(b"\n")
                if i < 0:
                    break
                line, buf = buf[: i + 1], buf[i + 1 :]
                yield _text(line if keepends else line[:-1])
        if buf:
            yield _text(buf)

    def __aiter__(self) -> AsyncIterator[str]:
        return self.iter_lines()

    async def read_bytes(self) -> bytes:
        return b"".join([b async for b in self.iter_bytes()])

    async def read(self) -> str:
        return _text(await self.read_bytes())


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


class AsyncStdin:
    """A process's stdin (exec with ``stdin=True``)."""

    def __init__(self, proc: "AsyncProcess") -> None:
        self._proc = proc
        self.closed = False

    async def write(self, data: Data) -> int:
        b = _spec.stdin_bytes(data)
        if self.closed:
            raise ValueError("write to a closed stdin")
        await self._proc._client.request("POST", f"{self._proc._base}/stdin", content=b)
        return len(b)

    async def close(self) -> None:
        if self.closed:
            return
        await self._proc._client.request("POST", f"{self._proc._base}/stdin/close")
        self.closed = True


class AsyncProcess:
    """A process in a sandbox; its output is read by a task as soon as it is needed."""

    def __init__(
        self,
        sandbox: "AsyncSandbox",
        info: ProcessInfo,
        *,
        on_stdout: Optional[AsyncCallback] = None,
        on_stderr: Optional[AsyncCallback] = None,
        from_offsets: "tuple[int, int]" = (0, 0),
    ) -> None:
        self.sandbox = sandbox
        self.info = info
        self._client = sandbox._client
        self._base = f"/v1/sandboxes/{sandbox.id}/processes/{info.id}"
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._decoders = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in ("stdout", "stderr")}
        self._pipes = {"stdout": _AsyncPipe(), "stderr": _AsyncPipe()}
        self._merged = _AsyncPipe()
        self._out = _output.OutputState(from_offsets)
        self._exit: Optional[ExitStatus] = info.exit
        self._exited = asyncio.Event()
        self._error: Optional[BaseException] = None
        self._task: "Optional[asyncio.Task[None]]" = None
        self._closing = False
        self._stack: Optional[contextlib.AsyncExitStack] = None
        self.stdin: Optional[AsyncStdin] = AsyncStdin(self) if info.stdin else None

    def __repr__(self) -> str:
        return f"<AsyncProcess {self.info.id} pid={self.info.pid} argv={self.info.argv!r} returncode={self.returncode}>"

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def pid(self) -> int:
        return self.info.pid

    @property
    def stdout(self) -> AsyncOutputStream:
        return AsyncOutputStream(self._pipes["stdout"], self._start_split, "stdout")

    @property
    def stderr(self) -> AsyncOutputStream:
        return AsyncOutputStream(self._pipes["stderr"], self._start_split, "stderr")

    def _start_split(self) -> None:
        self._choose(_output.SPLIT)
        self._ensure_reader()

    def _choose(self, mode: str) -> None:
        for c in self._out.choose(mode):
            self._route(c)

    def _route(self, c: OutputChunk) -> None:
        if self._out.mode == _output.SPLIT:
            self._pipes[c.stream].feed(c.data)
        else:
            self._merged.feed(c)

    @property
    def exit(self) -> Optional[ExitStatus]:
        return self._exit

    @property
    def returncode(self) -> Optional[int]:
        return self._exit.returncode if self._exit else None

    def _start_reader(self, lines: Optional[AsyncIterator[str]], stack: Optional[contextlib.AsyncExitStack]) -> None:
        if self._task is not None:
            return
        self._stack = stack
        self._task = asyncio.get_running_loop().create_task(self._run_reader(lines))

    def _ensure_reader(self) -> None:
        if self._task is None:
            self._start_reader(None, None)

    async def _run_reader(self, lines: Optional[AsyncIterator[str]]) -> None:
        err: Optional[BaseException] = None
        try:
            attempts = 0
            while True:
                try:
                    if lines is None:
                        async with self._client.stream(
                            "GET",
                            f"{self._base}/output",
                            params=self._out.params(),
                        ) as resp:
                            await self._consume(resp.aiter_lines())
                    else:
                        try:
                            await self._consume(lines)
                        finally:
                            lines = None
                            if self._stack is not None:
                                await self._stack.aclose()
                    if self._exited.is_set() or self._closing:
                        break
                    # The stream ended without the exit (a proxy or the daemon went
                    # away): re-attach from our offsets; a stopped sandbox answers 409.
                    attempts += 1
                    if attempts > _RECONNECTS:
                        break
                    await asyncio.sleep(0.1 * attempts)
                except (httpx.TransportError, errors.SandlotError) as e:
                    if isinstance(e, errors.APIError) or self._closing or self._exited.is_set():
                        raise
                    attempts += 1
                    if attempts > _RECONNECTS:
                        raise
                    await asyncio.sleep(0.1 * attempts)
        except asyncio.CancelledError:
            err = (
                None
                if self._closing
                else errors.SandlotError(f"reading the output of process {self.info.id} was cancelled")
            )
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            err = e if not self._closing else None
        finally:
            if err is None and not self._exited.is_set() and not self._closing:
                err = errors.SandlotError(
                    f"the output stream of process {self.info.id} ended before it exited (was the sandbox stopped?)"
                )
            self._error = err
            exited = self._exited.is_set()
            for name, pipe in self._pipes.items():
                await self._flush_callback(name)
                pipe.close(err if not exited else None)
            self._merged.close(err if not exited else None)
            self._exited.set()

    async def _consume(self, lines: AsyncIterator[str]) -> None:
        async for line in lines:
            if self._closing:
                return
            ev = self._out.event(line)
            if isinstance(ev, OutputChunk):
                await self._deliver(ev)
            elif isinstance(ev, _output.Exited):
                self._exit = ev.status
                self._exited.set()
            elif isinstance(ev, _output.Started):
                self.info = ev.info

    async def _deliver(self, c: OutputChunk) -> None:
        if not self._out.hold(c):
            self._route(c)
        cb = self._callbacks[c.stream]
        if cb is not None:
            text = self._decoders[c.stream].decode(c.data)
            if text:
                r = cb(text)
                if inspect.isawaitable(r):
                    await r

    async def _flush_callback(self, name: str) -> None:
        cb = self._callbacks[name]
        if cb is not None:
            rest = self._decoders[name].decode(b"", final=True)
            if rest:
                with contextlib.suppress(Exception):
                    r = cb(rest)
                    if inspect.isawaitable(r):
                        await r

    async def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the exit; returns the return code (``-N``: killed by signal N)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        self._ensure_reader()
        try:
            await asyncio.wait_for(self._exited.wait(), timeout)
        except asyncio.TimeoutError:
            raise errors.ProcessTimeoutError(
                f"process {self.info.id} ({self.info.argv!r}) still runs after {timeout}s"
            ) from None
        if self._exit is None and isinstance(self._error, errors.GoneError):
            # Its output is no longer retained; the exit status still is.
            while True:
                left = 3600.0 if deadline is None else max(0.0, deadline - loop.time())
                r = await self._client.json(
                    "GET", f"{self._base}/wait", params={"timeout": f"{max(left, 0.001):.3f}"}, timeout=left + 30
                )
                if r.get("exited") and r.get("exit"):
                    self._exit = ExitStatus.from_json(r["exit"])
                    break
                if deadline is not None and loop.time() >= deadline:
                    raise errors.ProcessTimeoutError(f"process {self.info.id} ({self.info.argv!r}) still runs")
        if self._exit is None:
            raise self._error or errors.SandlotError(f"process {self.info.id}: no exit status")
        return self._exit.returncode

    async def poll(self) -> Optional[int]:
        if self._exit is None and self._task is None:
            info = ProcessInfo.from_json(await self._client.json("GET", self._base))
            self.info = info
            if info.exit is not None:
                self._exit = info.exit
        return self.returncode

    async def refresh(self) -> ProcessInfo:
        self.info = ProcessInfo.from_json(await self._client.json("GET", self._base))
        return self.info

    async def signal(self, sig: Union[str, int]) -> None:
        await self._client.request("POST", f"{self._base}/signal", json={"signal": sig})

    async def terminate(self) -> None:
        await self.signal("TERM")

    async def kill(self) -> None:
        await self.signal("KILL")

    async def resize(self, rows: int, cols: int) -> None:
        await self._client.request("POST", f"{self._base}/resize", json={"rows": rows, "cols": cols})

    async def iter_output(self) -> AsyncIterator[OutputChunk]:
        """Stdout and stderr chunks in arrival order (instead of ``stdout``/``stderr``)."""
        self._choose(_output.MERGED)
        self._ensure_reader()
        while True:
            c = await self._merged.read_chunk()
            if c is None:
                return
            yield c

    async def result(self) -> RunResult:
        """Waits for the exit and the end of both streams; the output not consumed
        yet (after ``iter_output()``, what it has not yielded)."""
        await self.wait()
        if self._out.mode == _output.MERGED:
            rest: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
            while True:
                c = await self._merged.read_chunk()
                if c is None:
                    break
                rest[c.stream] += c.data
            out, err = bytes(rest["stdout"]), bytes(rest["stderr"])
        else:
            out = await self.stdout.read_bytes()
            err = await self.stderr.read_bytes()
        assert self._exit is not None
        return RunResult(argv=list(self.info.argv), stdout_bytes=out, stderr_bytes=err, exit=self._exit)

    async def close(self) -> None:
        """Stops reading its output (the process keeps running)."""
        self._closing = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._stack is not None:
            with contextlib.suppress(Exception):
                await self._stack.aclose()


async def _file_chunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    while True:
        b = await asyncio.to_thread(f.read, _CHUNK)
        if not b:
            return
        yield b


async def _iter_to_async(it: Iterable[bytes]) -> AsyncIterator[bytes]:
    for b in it:
        yield bytes(b)


def _body(data: Any) -> Any:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        return _file_chunks(data)
    if hasattr(data, "__aiter__"):
        return data
    if isinstance(data, Iterable):
        return _iter_to_async(data)
    raise TypeError(
        f"file data is bytes, str, a binary file or an (async) iterable of bytes, not {type(data).__name__}"
    )


class AsyncWatch:
    """``async for ev in watch``; ``await watch.aclose()`` (or ``async with``) to stop."""

    def __init__(self, resp: httpx.Response, stack: contextlib.AsyncExitStack) -> None:
        self._lines = resp.aiter_lines()
        self._stack = stack

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            try:
                line = await self._lines.__anext__()
            except (httpx.TransportError, httpx.StreamError) as e:
                raise StopAsyncIteration from e
            if line:
                ev = json.loads(line)
                if ev.get("type") == "error":
                    raise errors.from_stream_error(ev.get("error") or {})
                return WatchEvent.from_json(ev)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncFiles:
    """File operations in a sandbox."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._client = sandbox._client
        self._base = f"/v1/sandboxes/{sandbox.id}/files"

    async def iter_read(
        self, path: str, *, offset: Optional[int] = None, length: Optional[int] = None, chunk_size: int = _CHUNK
    ) -> AsyncIterator[bytes]:
        params: Dict[str, Any] = {"path": path}
        if offset is not None:
            params["offset"] = offset
        if length is not None:
            params["length"] = length
        async with self._client.stream("GET", self._base, params=params) as resp:
            async for b in resp.aiter_bytes(chunk_size):
                yield b

    async def read(self, path: str, *, offset: Optional[int] = None, length: Optional[int] = None) -> bytes:
        return b"".join([b async for b in self.iter_read(path, offset=offset, length=length)])

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return (await self.read(path)).decode(encoding, errors)

    async def download(self, path: str, local_path: Union[str, "os.PathLike[str]"]) -> int:
        n = 0
        tmp = f"{os.fspath(local_path)}.sandlot-partial"
        try:
            # Opened on a thread, as the writes are: a FIFO or a slow file system at
            # that path must not stall the event loop.
            with await asyncio.to_thread(lambda: open(tmp, "wb")) as f:
                async for chunk in self.iter_read(path):
                    await asyncio.to_thread(f.write, chunk)
                    n += len(chunk)
            os.replace(tmp, local_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return n

    async def write(
        self,
        path: str,
        data: Union[Data, IO[bytes], Iterable[bytes], AsyncIterable[bytes]],
        *,
        mode: Union[int, str, None] = None,
        append: bool = False,
    ) -> int:
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = _spec.mode_str(mode)
        if append:
            params["append"] = "true"
        r = await self._client.json("PUT", self._base, params=params, content=_body(data))
        return int(r.get("bytes", 0))

    async def write_text(
        self, path: str, text: str, *, encoding: str = "utf-8", mode: Union[int, str, None] = None
    ) -> int:
        return await self.write(path, text.encode(encoding), mode=mode)

    async def upload(
        self, local_path: Union[str, "os.PathLike[str]"], path: str, *, mode: Union[int, str, None] = None
    ) -> int:
        # Opened on a thread, as it is read (a FIFO would block the event loop).
        with await asyncio.to_thread(lambda: open(local_path, "rb")) as f:
            if mode is None:
                mode = os.fstat(f.fileno()).st_mode & 0o7777
            return await self.write(path, f, mode=mode)

    async def stat(self, path: str, *, follow: bool = False) -> FileInfo:
        params: Dict[str, Any] = {"path": path}
        if follow:
            params["follow"] = "true"
        return FileInfo.from_json(await self._client.json("GET", f"{self._base}/stat", params=params))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
            return True
        except errors.NotFoundError:
            return False

    async def list(self, path: str, *, depth: int = 1) -> List[FileInfo]:
        r = await self._client.json("GET", f"{self._base}/list", params={"path": path, "depth": depth})
        return [FileInfo.from_json(e) for e in r.get("entries", [])]

    async def mkdir(self, path: str, *, parents: bool = False, mode: Union[int, str, None] = None) -> None:
        body: Dict[str, Any] = {"path": path, "parents": parents}
        if mode is not None:
            body["mode"] = _spec.mode_str(mode)
        await self._client.request("POST", f"{self._base}/mkdir", json=body)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        params: Dict[str, Any] = {"path": path}
        if recursive:
            params["recursive"] = "true"
        await self._client.request("DELETE", self._base, params=params)

    async def rename(self, src: str, dst: str, *, overwrite: bool = True) -> None:
        await self._client.request(
            "POST", f"{self._base}/rename", json={"from": src, "to": dst, "overwrite": overwrite}
        )

    async def watch(self, path: str, *, recursive: bool = False) -> AsyncWatch:
        params: Dict[str, Any] = {"path": path}
        if recursive:
            params["recursive"] = "true"
        stack = contextlib.AsyncExitStack()
        resp = await stack.enter_async_context(self._client.stream("GET", f"{self._base}/watch", params=params))
        return AsyncWatch(resp, stack)

    async def upload_dir(self, local_dir: Union[str, "os.PathLike[str]"], path: str) -> TarResult:
        with tempfile.TemporaryFile() as tmp:

            def build() -> None:
                with tarfile.open(fileobj=tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    tar.add(os.fspath(local_dir), arcname=".")
                tmp.seek(0)

            await asyncio.to_thread(build)
            r = await self._client.json(
                "PUT",
                f"{self._base}/tar",
                params={"path": path},
                content=_file_chunks(tmp),
                headers={"content-type": "application/x-tar"},
            )
        return TarResult.from_json(r)

    async def download_dir(self, path: str, local_dir: Union[str, "os.PathLike[str]"]) -> List[str]:
        os.makedirs(local_dir, exist_ok=True)
        with tempfile.TemporaryFile() as tmp:
            async with self._client.stream("GET", f"{self._base}/tar", params={"path": path}) as resp:
                async for chunk in resp.aiter_bytes(_CHUNK):
                    tmp.write(chunk)
            tmp.seek(0)
            return await asyncio.to_thread(extract_tar, tmp, os.fspath(local_dir))


class AsyncSandbox:
    """A sandbox, asyncio flavour: ``sb = await AsyncSandbox.create()``, or
    ``async with await AsyncSandbox.create() as sb:`` (terminated on exit)."""

    def __init__(self, info: SandboxInfo, client: AsyncClient) -> None:
        self._info = info
        self._client = client
        self.id = info.id
        self.files = AsyncFiles(self)
        #: Inbound traffic: ``ports[8000].url`` (the proxy), ``await ports.publish(8000)``.
        self.ports = AsyncPorts(client, info.id)
        #: Egress: ``network.get()``, ``network.set(allow=[...])``, ``network.log()``.
        self.network = AsyncNetwork(client, info.id)

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id} name={self._info.name!r} state={self._info.state!r}>"

    @classmethod
    async def create(
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
        client: Optional[AsyncClient] = None,
    ) -> "AsyncSandbox":
        """Creates a sandbox (see ``Sandbox.create`` for the arguments)."""
        c = client or default_async_client()
        if isinstance(image, Image):
            # Built (or pulled) through the API on first use; cached afterwards.
            image = await image.abuild(client=c)
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
        info = await c.json("POST", "/v1/sandboxes", json=body, headers={"Idempotency-Key": key})
        return cls(SandboxInfo.from_json(info), c)

    @classmethod
    async def connect(cls, id_or_name: str, *, client: Optional[AsyncClient] = None) -> "AsyncSandbox":
        c = client or default_async_client()
        return cls(await c.get_sandbox(id_or_name), c)

    from_id = connect

    @classmethod
    async def list(
        cls,
        *,
        tags: Union[Mapping[str, Optional[str]], Iterable[str], None] = None,
        state: Union[str, Iterable[str], None] = None,
        name: Optional[str] = None,
        limit: Optional[int] = None,
        client: Optional[AsyncClient] = None,
    ) -> List["AsyncSandbox"]:
        c = client or default_async_client()
        r = await c.json("GET", "/v1/sandboxes", params=_spec.list_params(tags, state, name, limit))
        return [cls(SandboxInfo.from_json(d), c) for d in r.get("sandboxes", [])]

    async def refresh(self) -> SandboxInfo:
        self._info = await self._client.get_sandbox(self.id)
        return self._info

    @property
    def info(self) -> SandboxInfo:
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

    async def usage(self) -> Usage:
        return (await self.refresh()).usage

    async def events(self, after: int = 0) -> List[SandboxEvent]:
        r = await self._client.json("GET", f"/v1/sandboxes/{self.id}/events", params={"after": after})
        return [SandboxEvent.from_json(e) for e in r.get("events", [])]

    async def metrics(self, start: Optional[datetime] = None, end: Optional[datetime] = None) -> List[MetricsSample]:
        """See :meth:`sandlot.Sandbox.metrics`."""
        r = await self._client.json("GET", f"/v1/sandboxes/{self.id}/metrics", params=metrics_params(start, end))
        return [MetricsSample.from_json(x) for x in r.get("samples", [])]

    # --- checkpoints and forks ------------------------------------------------

    async def checkpoint(self, name: Optional[str] = None, *, leave_running: bool = True) -> Checkpoint:
        """See :meth:`sandlot.Sandbox.checkpoint`."""
        body: Dict[str, Any] = {"leave_running": leave_running}
        if name is not None:
            body["name"] = name
        d = await self._client.json("POST", f"/v1/sandboxes/{self.id}/checkpoints", json=body)
        return Checkpoint.from_json(d)

    async def checkpoints(self) -> List[Checkpoint]:
        """See :meth:`sandlot.Sandbox.checkpoints`."""
        r = await self._client.json("GET", f"/v1/sandboxes/{self.id}/checkpoints")
        return [Checkpoint.from_json(c) for c in r.get("checkpoints", [])]

    async def restore(self, checkpoint: Union[str, Checkpoint]) -> SandboxInfo:
        """See :meth:`sandlot.Sandbox.restore`."""
        cp = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        d = await self._client.json("POST", f"/v1/sandboxes/{self.id}/checkpoints/{cp}/restore")
        self._info = SandboxInfo.from_json(d["sandbox"])
        return self._info

    async def delete_checkpoint(self, checkpoint: Union[str, Checkpoint]) -> None:
        """See :meth:`sandlot.Sandbox.delete_checkpoint`."""
        cp = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        await self._client.request("DELETE", f"/v1/sandboxes/{self.id}/checkpoints/{cp}")

    async def diff_checkpoints(self, a: Union[str, Checkpoint], b: Union[str, Checkpoint]) -> Dict[str, List[str]]:
        """See :meth:`sandlot.Sandbox.diff_checkpoints`."""
        ca = a.id if isinstance(a, Checkpoint) else a
        cb = b.id if isinstance(b, Checkpoint) else b
        r = await self._client.json(
            "GET", f"/v1/sandboxes/{self.id}/checkpoints/{ca}/diff", params={"against": cb}
        )
        return {k: [str(p) for p in r.get(k, [])] for k in ("added", "changed", "removed")}

    async def fork(
        self, count: int = 1, *, checkpoint: Union[str, Checkpoint, None] = None
    ) -> List["AsyncSandbox"]:
        """See :meth:`sandlot.Sandbox.fork`."""
        body: Dict[str, Any] = {"count": count}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        d = await self._client.json("POST", f"/v1/sandboxes/{self.id}/fork", json=body)
        return [type(self)(SandboxInfo.from_json(s), self._client) for s in d.get("sandboxes", [])]

    async def create_snapshot(
        self, name: Optional[str] = None, *, checkpoint: Union[str, Checkpoint, None] = None
    ) -> Snapshot:
        """See :meth:`sandlot.Sandbox.create_snapshot`."""
        body: Dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if checkpoint is not None:
            body["checkpoint"] = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        d = await self._client.json("POST", f"/v1/sandboxes/{self.id}/snapshots", json=body)
        return Snapshot.from_json(d)

    @classmethod
    async def list_snapshots(
        cls,
        *,
        sandbox_id: Optional[str] = None,
        name: Optional[str] = None,
        client: Optional[AsyncClient] = None,
    ) -> List[Snapshot]:
        """See :meth:`sandlot.Sandbox.list_snapshots`."""
        c = client or default_async_client()
        params: Dict[str, str] = {}
        if sandbox_id is not None:
            params["sandbox_id"] = sandbox_id
        if name is not None:
            params["name"] = name
        r = await c.json("GET", "/v1/snapshots", params=params)
        return [Snapshot.from_json(d) for d in r.get("snapshots", [])]

    @classmethod
    async def delete_snapshot(
        cls, snapshot: Union[str, Snapshot], *, client: Optional[AsyncClient] = None
    ) -> None:
        """See :meth:`sandlot.Sandbox.delete_snapshot`."""
        c = client or default_async_client()
        sn = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        await c.request("DELETE", f"/v1/snapshots/{sn}")

    @classmethod
    async def from_snapshot(
        cls,
        snapshot: Union[str, Snapshot],
        *,
        timeout: Optional[int] = None,
        client: Optional[AsyncClient] = None,
    ) -> "AsyncSandbox":
        """See :meth:`sandlot.Sandbox.from_snapshot`."""
        c = client or default_async_client()
        sn = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        body: Dict[str, Any] = {}
        if timeout is not None:
            body["timeout"] = timeout
        d = await c.json("POST", f"/v1/snapshots/{sn}/sandboxes", json=body)
        return cls(SandboxInfo.from_json(d), c)

    async def snapshot_filesystem(self, tag: Optional[str] = None) -> Dict[str, Any]:
        """See :meth:`sandlot.Sandbox.snapshot_filesystem`."""
        snap: Dict[str, Any] = await self._client.json(
            "POST", f"/v1/sandboxes/{self.id}/snapshot", json={"tag": tag} if tag else {}
        )
        return snap

    async def pause(self) -> SandboxInfo:
        """See :meth:`sandlot.Sandbox.pause`."""
        d = await self._client.json("POST", f"/v1/sandboxes/{self.id}/pause")
        self._info = SandboxInfo.from_json(d)
        return self._info

    @classmethod
    async def resume(cls, id_or_name: str, *, client: Optional[AsyncClient] = None) -> "AsyncSandbox":
        """See :meth:`sandlot.Sandbox.resume`."""
        c = client or default_async_client()
        d = await c.json("POST", f"/v1/sandboxes/{id_or_name}/resume")
        return cls(SandboxInfo.from_json(d), c)

    async def set_timeout(self, timeout: _spec.Duration) -> SandboxInfo:
        d = await self._client.json(
            "POST", f"/v1/sandboxes/{self.id}/timeout", json={"timeout": _spec.duration(timeout)}
        )
        self._info = SandboxInfo.from_json(d)
        return self._info

    async def terminate(self) -> SandboxInfo:
        self._info = SandboxInfo.from_json(await self._client.json("DELETE", f"/v1/sandboxes/{self.id}"))
        return self._info

    kill = terminate

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        with contextlib.suppress(errors.NotFoundError):
            await self.terminate()

    async def exec(
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
        on_stdout: Optional[AsyncCallback] = None,
        on_stderr: Optional[AsyncCallback] = None,
    ) -> AsyncProcess:
        """Starts ``argv`` (see ``Sandbox.exec``); callbacks may be coroutine functions."""
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
            info = ProcessInfo.from_json(await self._client.json("POST", path, json=body))
            proc = AsyncProcess(self, info, on_stdout=on_stdout, on_stderr=on_stderr)
            if on_stdout or on_stderr:
                proc._ensure_reader()
        else:
            stack = contextlib.AsyncExitStack()
            try:
                resp = await stack.enter_async_context(
                    self._client.stream("POST", path, params={"stream": "ndjson"}, json=body)
                )
                lines = resp.aiter_lines()
                first = await _first_line(lines)
            except errors.SpawnError as e:
                await stack.aclose()
                _hint_shell(e, args)
                raise
            except BaseException:
                await stack.aclose()
                raise
            proc = AsyncProcess(self, ProcessInfo.from_json(first["process"]), on_stdout=on_stdout, on_stderr=on_stderr)
            proc._start_reader(lines, stack)
        if want_stdin and stdin is not True:
            assert proc.stdin is not None
            await proc.stdin.write(stdin)  # type: ignore[arg-type]
            await proc.stdin.close()
        return proc

    async def run(
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
        """Runs a command to completion (see ``Sandbox.run``)."""
        p = await self.exec(*_spec.shell_argv(cmd), env=env, cwd=cwd, user=user, stdin=stdin, timeout=timeout)
        r = await p.result()
        if check and r.exit_code != 0:
            raise (errors.CommandTimeoutError if r.exit.timed_out else errors.CommandError)(r)
        return r

    async def processes(self) -> List[ProcessInfo]:
        r = await self._client.json("GET", f"/v1/sandboxes/{self.id}/processes")
        return [ProcessInfo.from_json(p) for p in r.get("processes", [])]

    async def process(self, id: int, *, stdout_from: int = 0, stderr_from: int = 0) -> AsyncProcess:
        info = ProcessInfo.from_json(await self._client.json("GET", f"/v1/sandboxes/{self.id}/processes/{id}"))
        return AsyncProcess(self, info, from_offsets=(stdout_from, stderr_from))

    attach = process

    # --- code contexts -------------------------------------------------------

    async def run_code(
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
        """See ``Sandbox.run_code``; callbacks may be coroutine functions."""
        cb = _code.Callbacks(on_stdout, on_stderr, on_result, on_error)
        col = _code.Collector(cb)
        path = f"/v1/sandboxes/{self.id}/contexts/{_code.context_id(context)}/run"
        body = _code.run_body(code, timeout, env)
        async with self._client.stream("POST", path, params={"stream": "ndjson"}, json=body) as resp:
            async for line in resp.aiter_lines():
                for r in col.feed(line):
                    if inspect.isawaitable(r):
                        await r
        return col.result()

    async def create_code_context(
        self,
        language: str = "python",
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> _code.CodeContext:
        d = await self._client.json(
            "POST", f"/v1/sandboxes/{self.id}/contexts", json=_code.create_body(language, cwd, env)
        )
        return _code.CodeContext.from_json(d)

    async def list_code_contexts(self) -> List[_code.CodeContext]:
        return _code.contexts_of(await self._client.json("GET", f"/v1/sandboxes/{self.id}/contexts"))

    async def restart_code_context(self, context: Union[str, _code.CodeContext]) -> _code.CodeContext:
        d = await self._client.json(
            "POST", f"/v1/sandboxes/{self.id}/contexts/{_code.context_id(context)}/restart"
        )
        return _code.CodeContext.from_json(d)

    async def interrupt_code(self, context: Union[None, str, _code.CodeContext] = None) -> None:
        await self._client.request(
            "POST", f"/v1/sandboxes/{self.id}/contexts/{_code.context_id(context)}/interrupt"
        )

    async def remove_code_context(self, context: Union[str, _code.CodeContext]) -> None:
        await self._client.request("DELETE", f"/v1/sandboxes/{self.id}/contexts/{_code.context_id(context)}")


async def _first_line(lines: AsyncIterator[str]) -> Dict[str, Any]:
    async for line in lines:
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
