"""Sandlot Python SDK: secure, ephemeral Linux sandboxes for AI agents.

    from sandlot import Sandbox

    with Sandbox.create(memory="512M", timeout=60) as sb:
        print(sb.run("python3 -c 'print(6*7)'").stdout)   # 42

The asyncio twin is ``AsyncSandbox``. Connection: ``SANDLOT_URL`` (default
``unix:///run/sandlot/sandlot.sock``) and ``SANDLOT_TOKEN``, or an explicit
``Client(url=..., token=...)`` passed as ``client=``.
"""

from .aio import AsyncFiles, AsyncOutputStream, AsyncProcess, AsyncSandbox, AsyncStdin, AsyncWatch
from .client import DEFAULT_URL, AsyncClient, Client, __version__, configure, default_async_client, default_client
from .errors import (
    AlreadyExistsError,
    APIError,
    AuthError,
    BadRequestError,
    CommandError,
    CommandTimeoutError,
    ConflictError,
    ConnectError,
    DirectoryNotEmptyError,
    GoneError,
    InternalError,
    InvalidSpecError,
    InvalidUserError,
    IsADirectoryError_,
    MethodNotAllowedError,
    NoSpaceError,
    NotADirectoryError_,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProcessExitedError,
    ProcessTimeoutError,
    ProtocolError,
    QuotaExceededError,
    SandlotError,
    SpawnError,
    StreamError,
    UnavailableError,
)
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
)
from .image import BuildError, Image
from .memory import AsyncMemoryStore, MemoryStore
from .sandbox import Files, OutputStream, Process, Sandbox, Stdin, Watch

__all__ = [
    "BuildError",
    "Image",
    "__version__",
    "DEFAULT_URL",
    "Sandbox",
    "Process",
    "Files",
    "OutputStream",
    "Stdin",
    "Watch",
    "AsyncSandbox",
    "AsyncProcess",
    "AsyncFiles",
    "AsyncOutputStream",
    "AsyncStdin",
    "AsyncWatch",
    "MemoryStore",
    "AsyncMemoryStore",
    "Client",
    "AsyncClient",
    "configure",
    "default_client",
    "default_async_client",
    "SandboxInfo",
    "Usage",
    "ProcessInfo",
    "ExitStatus",
    "RunResult",
    "FileInfo",
    "WatchEvent",
    "TarResult",
    "SandboxEvent",
    "OutputChunk",
    "SandlotError",
    "ConnectError",
    "APIError",
    "BadRequestError",
    "InvalidSpecError",
    "SpawnError",
    "InvalidUserError",
    "AuthError",
    "PermissionDeniedError",
    "NotFoundError",
    "MethodNotAllowedError",
    "ConflictError",
    "AlreadyExistsError",
    "NotADirectoryError_",
    "IsADirectoryError_",
    "DirectoryNotEmptyError",
    "ProcessExitedError",
    "GoneError",
    "PayloadTooLargeError",
    "QuotaExceededError",
    "InternalError",
    "UnavailableError",
    "NoSpaceError",
    "ProtocolError",
    "StreamError",
    "ProcessTimeoutError",
    "CommandError",
    "CommandTimeoutError",
]
