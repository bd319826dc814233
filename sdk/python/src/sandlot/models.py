"""Typed views of the API's objects. Each keeps the full JSON it was built from
in ``raw`` (responses may gain fields; unknown ones are kept there, never refused)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence


def parse_time(s: Optional[str]) -> Optional[datetime]:
    """An RFC 3339 timestamp of the API (``2026-11-30T00:12:47.123Z``) as an aware datetime."""
    if not s:
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Usage:
    """Metered usage of a sandbox."""

    cpu_seconds: float = 0.0
    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    wall_seconds: float = 0.0
    exec_count: int = 0
    stdin_bytes: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    file_bytes_in: int = 0
    file_bytes_out: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Optional[Dict[str, Any]]) -> "Usage":
        d = d or {}
        return cls(
            cpu_seconds=float(d.get("cpu_seconds", 0.0)),
            memory_bytes=int(d.get("memory_bytes", 0)),
            memory_peak_bytes=int(d.get("memory_peak_bytes", 0)),
            wall_seconds=float(d.get("wall_seconds", 0.0)),
            exec_count=int(d.get("exec_count", 0)),
            stdin_bytes=int(d.get("stdin_bytes", 0)),
            stdout_bytes=int(d.get("stdout_bytes", 0)),
            stderr_bytes=int(d.get("stderr_bytes", 0)),
            file_bytes_in=int(d.get("file_bytes_in", 0)),
            file_bytes_out=int(d.get("file_bytes_out", 0)),
            raw=dict(d),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the daemon reports it (``GET /v1/sandboxes/{id}``)."""

    id: str
    name: Optional[str]
    tenant: str
    state: str
    spec: Dict[str, Any]
    tags: Dict[str, str]
    metadata: Dict[str, str]
    created_at: Optional[datetime]
    started_at: Optional[datetime]
    ended_at: Optional[datetime]
    expires_at: Optional[datetime]
    idle_timeout: Optional[float]
    end_reason: Optional[str]
    exit_code: Optional[int]
    exit_signal: Optional[int]
    error: Optional[str]
    usage: Usage
    #: While paused: what the pause kept, ``"memory"`` (gVisor: every process,
    #: open file and socket inside) or ``"filesystem"`` (its files only).
    pause: Optional[str] = None
    #: What its idle timeout does: ``"kill"`` (the default) or ``"pause"``.
    on_idle: str = "kill"
    #: What its lifetime timeout does: ``"kill"`` (the default) or ``"pause"``.
    on_timeout: str = "kill"
    #: Exec, file, code and port calls on it while paused resume it first.
    auto_resume: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def paused(self) -> bool:
        return self.state == "paused"

    @property
    def memory_kept(self) -> bool:
        """Paused with its memory (its processes come back at resume)."""
        return self.pause == "memory"

    @property
    def stopped(self) -> bool:
        return self.state == "stopped"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SandboxInfo":
        ex = d.get("exit") or {}
        return cls(
            id=d["id"],
            name=d.get("name"),
            tenant=d.get("tenant", ""),
            state=d.get("state", ""),
            spec=d.get("spec") or {},
            tags=d.get("tags") or {},
            metadata=d.get("metadata") or {},
            created_at=parse_time(d.get("created_at")),
            started_at=parse_time(d.get("started_at")),
            ended_at=parse_time(d.get("ended_at")),
            expires_at=parse_time(d.get("expires_at")),
            idle_timeout=d.get("idle_timeout"),
            end_reason=d.get("end_reason"),
            exit_code=ex.get("code"),
            exit_signal=ex.get("signal"),
            error=d.get("error"),
            usage=Usage.from_json(d.get("usage")),
            pause=d.get("pause"),
            on_idle=d.get("on_idle") or "kill",
            on_timeout=d.get("on_timeout") or "kill",
            auto_resume=bool(d.get("auto_resume")),
            raw=d,
        )


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended. ``returncode`` follows ``subprocess``: the exit code, or
    ``-N`` when signal N killed it."""

    code: Optional[int]
    signal: Optional[int]
    core_dumped: bool = False
    timed_out: bool = False
    stdout_end: int = 0
    stderr_end: int = 0

    @property
    def returncode(self) -> int:
        if self.code is not None:
            return self.code
        if self.signal is not None:
            return -self.signal
        return -1

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExitStatus":
        return cls(
            code=d.get("code"),
            signal=d.get("signal"),
            core_dumped=bool(d.get("core_dumped", False)),
            timed_out=bool(d.get("timed_out", False)),
            stdout_end=int(d.get("stdout_end", 0)),
            stderr_end=int(d.get("stderr_end", 0)),
        )


@dataclass(frozen=True)
class ProcessInfo:
    """A process in a sandbox. ``id`` is the API's handle (not the pid)."""

    id: int
    pid: int
    argv: List[str]
    tag: Optional[str]
    pty: bool
    stdin: bool
    background: bool
    started_at: Optional[datetime]
    state: str
    exit: Optional[ExitStatus]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ProcessInfo":
        ex = d.get("exit")
        return cls(
            id=int(d["id"]),
            pid=int(d.get("pid", 0)),
            argv=list(d.get("argv") or []),
            tag=d.get("tag"),
            pty=bool(d.get("pty", False)),
            stdin=bool(d.get("stdin", False)),
            background=bool(d.get("background", False)),
            started_at=parse_time(d.get("started_at")),
            state=d.get("state", ""),
            exit=ExitStatus.from_json(ex) if ex else None,
            raw=d,
        )


@dataclass(frozen=True)
class RunResult:
    """The outcome of ``Sandbox.run``: decoded output (UTF-8, invalid bytes
    replaced), the exact bytes, and the exit status."""

    argv: Sequence[str]
    stdout_bytes: bytes
    stderr_bytes: bytes
    exit: ExitStatus

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def exit_code(self) -> int:
        return self.exit.returncode

    @property
    def returncode(self) -> int:
        return self.exit.returncode

    @property
    def ok(self) -> bool:
        return self.exit.returncode == 0

    def __repr__(self) -> str:
        return (
            f"RunResult(exit_code={self.exit_code}, stdout={_short(self.stdout)!r}, "
            f"stderr={_short(self.stderr)!r})"
        )


def _short(s: str, n: int = 200) -> str:
    return s if len(s) <= n else s[:n] + "..."


@dataclass(frozen=True)
class FileInfo:
    """``stat`` of a path in a sandbox (and listing entries: ``depth``, ``error``)."""

    path: str
    kind: str
    size: int
    mode: int
    uid: int
    gid: int
    mtime: Optional[datetime]
    symlink_target: Optional[str] = None
    depth: int = 0
    error: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_symlink(self) -> bool:
        return self.kind == "symlink"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileInfo":
        return cls(
            path=d["path"],
            kind=d.get("kind", ""),
            size=int(d.get("size", 0)),
            mode=int(d.get("mode", 0)),
            uid=int(d.get("uid", 0)),
            gid=int(d.get("gid", 0)),
            mtime=parse_time(d.get("mtime")),
            symlink_target=d.get("symlink_target"),
            depth=int(d.get("depth", 0)),
            error=d.get("error"),
            raw=d,
        )


@dataclass(frozen=True)
class WatchEvent:
    """A filesystem change: ``kind`` is create, modify, delete, rename or overflow."""

    kind: str
    path: Optional[str]
    from_path: Optional[str] = None
    dir: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "WatchEvent":
        return cls(
            kind=d.get("kind", ""),
            path=d.get("path"),
            from_path=d.get("from"),
            dir=bool(d.get("dir", False)),
            raw=d,
        )


@dataclass(frozen=True)
class TarResult:
    """What an uploaded directory (tar) became."""

    path: str
    files: int
    dirs: int
    bytes: int
    skipped: List[str]

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "TarResult":
        return cls(
            path=d.get("path", ""),
            files=int(d.get("files", 0)),
            dirs=int(d.get("dirs", 0)),
            bytes=int(d.get("bytes", 0)),
            skipped=list(d.get("skipped") or []),
        )


@dataclass(frozen=True)
class MetricsSample:
    """A running sandbox's CPU and memory at one moment (see :meth:`sandlot.Sandbox.metrics`)."""

    at: Optional[datetime]
    cpu_seconds: float
    """CPU time used since the sandbox started."""
    cpu_cores: float
    """Cores in use on average since the sample before (1.0 = one core busy)."""
    memory_bytes: int

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "MetricsSample":
        return cls(
            at=parse_time(d.get("at")),
            cpu_seconds=float(d.get("cpu_seconds", 0.0)),
            cpu_cores=float(d.get("cpu_cores", 0.0)),
            memory_bytes=int(d.get("memory_bytes", 0)),
        )


@dataclass(frozen=True)
class TenantInfo:
    """One tenant as the operator sees it (``GET /v1/tenants``, see
    :meth:`sandlot.Client.tenants`): its quota and what it holds now."""

    name: str
    configured: bool
    """Whether the daemon's configuration names it (else the default quota applies)."""
    max_sandboxes: int
    max_memory_bytes: int
    max_snapshots: int
    max_saved_disk_bytes: int
    sandboxes_live: int
    sandboxes_paused: int
    memory_limit_bytes: int
    """Sum of its live sandboxes' memory limits (what ``max_memory_bytes`` bounds)."""
    memory_in_use_bytes: int
    cpu_seconds: float
    snapshots: int
    saved_bytes: int
    active_tokens: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "TenantInfo":
        q = d.get("quota") or {}
        u = d.get("usage") or {}
        return cls(
            name=str(d.get("name", "")),
            configured=bool(d.get("configured", False)),
            max_sandboxes=int(q.get("max_sandboxes", 0)),
            max_memory_bytes=int(q.get("max_memory_bytes", 0)),
            max_snapshots=int(q.get("max_snapshots", 0)),
            max_saved_disk_bytes=int(q.get("max_saved_disk_bytes", 0)),
            sandboxes_live=int(u.get("sandboxes_live", 0)),
            sandboxes_paused=int(u.get("sandboxes_paused", 0)),
            memory_limit_bytes=int(u.get("memory_limit_bytes", 0)),
            memory_in_use_bytes=int(u.get("memory_in_use_bytes", 0)),
            cpu_seconds=float(u.get("cpu_seconds", 0.0)),
            snapshots=int(u.get("snapshots", 0)),
            saved_bytes=int(u.get("saved_bytes", 0)),
            active_tokens=int(u.get("active_tokens", 0)),
            raw=dict(d),
        )


def metrics_params(start: Optional[datetime], end: Optional[datetime]) -> Dict[str, int]:
    """The query of ``GET .../metrics`` for a range of aware or naive (UTC) datetimes."""
    out: Dict[str, int] = {}
    for name, t in (("start_ms", start), ("end_ms", end)):
        if t is not None:
            aware = t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)
            out[name] = int(aware.timestamp() * 1000)
    return out


@dataclass(frozen=True)
class SandboxEvent:
    """A lifecycle event: created, started, timeout_set, stopped."""

    seq: int
    at: Optional[datetime]
    kind: str
    message: str

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SandboxEvent":
        return cls(
            seq=int(d.get("seq", 0)),
            at=parse_time(d.get("at")),
            kind=d.get("kind", ""),
            message=d.get("message", ""),
        )


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a process's output, in arrival order: ``stream`` is ``stdout`` or ``stderr``."""

    stream: str
    data: bytes
    offset: int


def decode_chunk(line: Dict[str, Any]) -> OutputChunk:
    return OutputChunk(
        stream=line["type"],
        data=base64.b64decode(line.get("data") or ""),
        offset=int(line.get("offset", 0)),
    )


@dataclass(frozen=True)
class PublishedPort:
    """A sandbox port published on the daemon's host (``sb.ports.publish(8000)``):
    connect to ``host``:``host_port`` (``address``) to reach ``port`` in the sandbox."""

    port: int
    host: str
    host_port: int
    address: str
    created_at: Optional[datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "PublishedPort":
        return cls(
            port=int(d.get("port", 0)),
            host=str(d.get("host", "")),
            host_port=int(d.get("host_port", 0)),
            address=str(d.get("address", "")),
            created_at=parse_time(d.get("created_at")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class CollectionInfo:
    """A document collection of the caller's tenant (``GET /v1/vfs/{name}``)."""

    name: str
    version: int
    documents: int
    bytes: int
    source: str
    created_at: Optional[datetime]
    updated_at: Optional[datetime]
    sessions: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "CollectionInfo":
        return cls(
            name=d["name"],
            version=int(d.get("version", 0)),
            documents=int(d.get("documents", 0)),
            bytes=int(d.get("bytes", 0)),
            source=str(d.get("source", "")),
            created_at=parse_time(d.get("created_at")),
            updated_at=parse_time(d.get("updated_at")),
            sessions=int(d.get("sessions", 0)),
            raw=dict(d),
        )


@dataclass(frozen=True)
class IngestReport:
    """What a create or re-ingest did. ``changed`` is False when nothing differed
    from the previous version (no new version was published)."""

    version: int
    previous_version: Optional[int]
    changed: bool
    added: int
    updated: int
    removed: int
    unchanged: int
    fetched: int
    bytes_fetched: int
    documents: int
    bytes: int
    skipped: List[str]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "IngestReport":
        return cls(
            version=int(d.get("version", 0)),
            previous_version=d.get("previous_version"),
            changed=bool(d.get("changed", False)),
            added=int(d.get("added", 0)),
            updated=int(d.get("updated", 0)),
            removed=int(d.get("removed", 0)),
            unchanged=int(d.get("unchanged", 0)),
            fetched=int(d.get("fetched", 0)),
            bytes_fetched=int(d.get("bytes_fetched", 0)),
            documents=int(d.get("documents", 0)),
            bytes=int(d.get("bytes", 0)),
            skipped=list(d.get("skipped") or []),
            raw=dict(d),
        )


@dataclass(frozen=True)
class ShellResult:
    """The result of one command line in a virtual shell session. ``truncated``:
    output was cut at the session's limit. ``cwd``: the working directory after it."""

    stdout: str
    stderr: str
    exit_code: int
    truncated: bool
    duration_ms: float
    cwd: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ShellResult":
        return cls(
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            exit_code=int(d.get("exit_code", 0)),
            truncated=bool(d.get("truncated", False)),
            duration_ms=float(d.get("duration_ms", 0.0)),
            cwd=str(d.get("cwd", "/")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class ShellSessionInfo:
    """A virtual shell session (``GET /v1/vfs/{collection}/sessions/{id}``)."""

    id: str
    collection: str
    version: int
    principal: str
    groups: List[str]
    all_access: bool
    documents: int
    cwd: str
    commands_run: int
    created_at: Optional[datetime]
    last_used_at: Optional[datetime]
    expires_at: Optional[datetime]
    limits: Dict[str, Any]
    #: The copy-on-write scratch area (``used_bytes``, ``entries``,
    #: ``max_bytes``, ``max_entries``), or None without one.
    scratch: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ShellSessionInfo":
        return cls(
            id=d["id"],
            collection=str(d.get("collection", "")),
            version=int(d.get("version", 0)),
            principal=str(d.get("principal", "")),
            groups=list(d.get("groups") or []),
            all_access=bool(d.get("all_access", False)),
            documents=int(d.get("documents", 0)),
            cwd=str(d.get("cwd", "/")),
            commands_run=int(d.get("commands_run", 0)),
            created_at=parse_time(d.get("created_at")),
            last_used_at=parse_time(d.get("last_used_at")),
            expires_at=parse_time(d.get("expires_at")),
            limits=dict(d.get("limits") or {}),
            scratch=dict(d["scratch"]) if d.get("scratch") else None,
            raw=dict(d),
        )


@dataclass(frozen=True)
class AuditRecord:
    """One audited command line of a collection."""

    at: Optional[datetime]
    collection: str
    version: int
    session: str
    principal: str
    command: str
    exit_code: int
    stdout_bytes: int
    stderr_bytes: int
    truncated: bool
    duration_ms: float
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "AuditRecord":
        return cls(
            at=parse_time(d.get("at")),
            collection=str(d.get("collection", "")),
            version=int(d.get("version", 0)),
            session=str(d.get("session", "")),
            principal=str(d.get("principal", "")),
            command=str(d.get("command", "")),
            exit_code=int(d.get("exit_code", 0)),
            stdout_bytes=int(d.get("stdout_bytes", 0)),
            stderr_bytes=int(d.get("stderr_bytes", 0)),
            truncated=bool(d.get("truncated", False)),
            duration_ms=float(d.get("duration_ms", 0.0)),
            raw=dict(d),
        )


def _epoch_ms(v: Any) -> Optional[datetime]:
    """Milliseconds since the epoch (the volume and secret routes) as an aware datetime."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return datetime.fromtimestamp(v / 1000, tz=timezone.utc)


@dataclass(frozen=True)
class VolumeInfo:
    """A named volume of a tenant (``/v1/volumes``)."""

    name: str
    tenant: str
    size_limit: Optional[int]
    created_at: Optional[datetime]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "VolumeInfo":
        limit = d.get("size_limit")
        return cls(
            name=str(d.get("name", "")),
            tenant=str(d.get("tenant", "")),
            size_limit=None if limit is None else int(limit),
            created_at=_epoch_ms(d.get("created_at")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class SecretInfo:
    """A secret's metadata (``/v1/secrets``); its value is never returned."""

    name: str
    tenant: str
    created_at: Optional[datetime]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SecretInfo":
        return cls(
            name=str(d.get("name", "")),
            tenant=str(d.get("tenant", "")),
            created_at=_epoch_ms(d.get("created_at")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class NetworkPolicy:
    """A sandbox's egress policy: ``mode`` is ``none``, ``allow`` or ``open``; with
    ``allow``, ``allow`` lists the destinations (``{"domain": ..., "ports": [...]}``
    or ``{"cidr": ...}``). With ``open``, ``deny`` lists refused destinations (same
    shape) and ``allow`` the exceptions to them (an allow rule wins)."""

    mode: str
    allow: List[Dict[str, Any]]
    deny: List[Dict[str, Any]] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "NetworkPolicy":
        return cls(
            mode=str(d.get("mode", "none")),
            allow=[dict(r) for r in d.get("allow") or []],
            deny=[dict(r) for r in d.get("deny") or []],
            raw=dict(d),
        )


@dataclass(frozen=True)
class NetworkLogEntry:
    """One DNS query or TCP connection attempt of a sandbox, as the daemon decided it
    (``decision``: ``allowed``, ``denied`` or ``failed``)."""

    seq: int
    at: Optional[datetime]
    kind: str
    name: Optional[str]
    addr: Optional[str]
    port: Optional[int]
    decision: str
    reason: str
    bytes_out: int
    bytes_in: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "NetworkLogEntry":
        port = d.get("port")
        return cls(
            seq=int(d.get("seq", 0)),
            at=parse_time(d.get("at")),
            kind=str(d.get("kind", "")),
            name=d.get("name"),
            addr=d.get("addr"),
            port=None if port is None else int(port),
            decision=str(d.get("decision", "")),
            reason=str(d.get("reason", "")),
            bytes_out=int(d.get("bytes_out", 0)),
            bytes_in=int(d.get("bytes_in", 0)),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Checkpoint:
    """A saved state of a sandbox (``POST /v1/sandboxes/{id}/checkpoints``)."""

    id: str
    sandbox_id: str
    name: Optional[str]
    #: The checkpoint the sandbox's state came from when this one was taken (a
    #: restore or a fork sets it): a sandbox's checkpoints form a tree.
    parent: Optional[str]
    created_at: Optional[datetime]
    #: ``"memory"`` (gVisor: processes, memory and files) or ``"filesystem"``
    #: (files only: a restore or fork starts processes afresh).
    kind: str
    #: Bytes on the daemon's disk (a ``filesystem`` checkpoint's image is counted
    #: by the image store).
    size: int
    #: In the answer to a create only: the sandbox's state once the checkpoint
    #: is taken (``"running"``, or ``"paused"`` when asked to stay paused or when
    #: its resume after the checkpoint failed; the checkpoint is kept either way).
    sandbox_state: Optional[str] = field(default=None, compare=False)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def memory(self) -> bool:
        """Whether its processes and memory are kept."""
        return self.kind == "memory"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Checkpoint":
        return cls(
            id=d["id"],
            sandbox_id=d.get("sandbox_id", ""),
            name=d.get("name"),
            parent=d.get("parent"),
            created_at=parse_time(d.get("created_at")),
            kind=d.get("kind", "memory" if d.get("memory") else "filesystem"),
            size=int(d.get("size", 0)),
            sandbox_state=d.get("sandbox_state"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Snapshot:
    """A saved state of a sandbox that belongs to its tenant and outlives the
    sandbox (``POST /v1/sandboxes/{id}/snapshots``): kept after the sandbox ends
    and across daemon restarts, until deleted."""

    id: str
    name: Optional[str]
    #: The sandbox it was taken of (which may have ended since).
    sandbox_id: str
    created_at: Optional[datetime]
    #: ``"memory"`` (gVisor: a sandbox started from it continues its processes)
    #: or ``"filesystem"`` (namespace backend: files only; processes start afresh).
    kind: str
    #: Bytes of the daemon's disk it holds, counted against the tenant's
    #: ``max_saved_disk``.
    size: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def memory(self) -> bool:
        """Whether its processes and memory are kept."""
        return self.kind == "memory"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Snapshot":
        return cls(
            id=d["id"],
            name=d.get("name"),
            sandbox_id=d.get("sandbox_id", ""),
            created_at=parse_time(d.get("created_at")),
            kind=d.get("kind", "memory" if d.get("memory") else "filesystem"),
            size=int(d.get("size", 0)),
            raw=dict(d),
        )
