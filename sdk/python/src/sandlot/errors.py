"""Typed exceptions. Every error the daemon answers maps to one class by its
``code`` (falling back to its HTTP status); each carries the ``request_id`` to
find the daemon's log lines, and validation errors the ``field`` they name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .models import RunResult


class SandlotError(Exception):
    """Base class of every exception raised by this package."""


class ConnectError(SandlotError, ConnectionError):
    """The daemon could not be reached (socket missing, connection refused, ...)."""


class APIError(SandlotError):
    """An error answered by the daemon.

    Attributes: ``status`` (HTTP status), ``code`` (the API's error code, e.g.
    ``not_found``), ``message``, ``request_id`` and, for validation errors,
    ``field`` (e.g. ``resources.memory``)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str,
        request_id: Optional[str] = None,
        field: Optional[str] = None,
    ) -> None:
        self.message = message
        self.status = status
        self.code = code
        self.request_id = request_id
        self.field = field
        super().__init__(message)

    def __str__(self) -> str:
        rid = f", request {self.request_id}" if self.request_id else ""
        return f"{self.message} ({self.code}, HTTP {self.status}{rid})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, status={self.status}, "
            f"code={self.code!r}, request_id={self.request_id!r}, field={self.field!r})"
        )


class BadRequestError(APIError):
    """400: the request is malformed or invalid."""


class InvalidSpecError(BadRequestError):
    """400 naming a ``field``: a sandbox spec, exec body, path or query failed validation."""


class SpawnError(BadRequestError):
    """400 ``spawn_failed``: the command could not be started (not found, not executable)."""


class InvalidUserError(BadRequestError):
    """400 ``invalid_user``: no such user in the sandbox."""


class KernelUnavailableError(BadRequestError):
    """400 ``kernel_unavailable``: a code context's interpreter cannot start in
    this sandbox (no ``python3``, no ``ipykernel``); the message names what is
    missing."""


class UnsupportedMediaTypeError(BadRequestError):
    """415 ``unsupported_media_type``: a request body of a type the route does not take."""


class AuthError(APIError):
    """401: no, bad or revoked token."""


class PermissionDeniedError(APIError):
    """403: a file operation the sandbox user may not do."""


class ForbiddenError(PermissionDeniedError):
    """403 ``forbidden``: what only the operator may do, or a source the operator
    does not allow."""


class NotFoundError(APIError):
    """404: no such sandbox (for this caller), process, file or route."""


class MethodNotAllowedError(APIError):
    """405."""


class ConflictError(APIError):
    """409: wrong state (sandbox stopped, name taken, stdin closed, ...)."""


class AlreadyExistsError(ConflictError):
    """409 ``already_exists``."""


class InvalidStateError(ConflictError):
    """409 ``invalid_state``: the sandbox is in a state where this cannot happen
    (work on a paused sandbox, a pause of a paused one, a resume of a running one);
    the message names the state."""


class PauseRefusedError(ConflictError):
    """409 ``pause_refused``: the sandbox cannot be saved as it is (on gVisor, a
    Unix socket bound in its root filesystem or ``/tmp``); it runs on."""


class CheckpointDamagedError(ConflictError):
    """409 ``checkpoint_damaged``: a paused sandbox's saved memory image is not
    what was saved; it stays paused and can only be terminated."""


class LifetimeExceededError(ConflictError):
    """409 ``lifetime_exceeded``: a paused sandbox past the operator's maximum
    lifetime is not resumed; it can only be deleted."""


class NotADirectoryError_(ConflictError):
    """409 ``not_a_directory``."""


class IsADirectoryError_(ConflictError):
    """409 ``is_a_directory``."""


class DirectoryNotEmptyError(ConflictError):
    """409 ``directory_not_empty``."""


class ProcessExitedError(ConflictError):
    """409 ``process_exited``."""


class GoneError(APIError):
    """410: the process exited and its output is no longer retained."""


class PayloadTooLargeError(APIError):
    """413: request body or upload over the operator's limit (``payload_too_large``),
    or a snapshot, download or image export/diff that would read more than the
    sandbox's disk limit or the operator's ``images.max_expanded_size``
    (``too_large``; holes of sparse files count)."""


class BuildFailedError(APIError):
    """422 ``build_failed``: an image build failed (a step, or the operator's time limit)."""


class IdempotencyMismatchError(APIError):
    """422 ``idempotency_mismatch``: an ``Idempotency-Key`` already used for a
    create with another body."""


class SandboxIOError(APIError):
    """422 ``io``: a file operation inside the sandbox failed with an I/O error."""


class QuotaExceededError(APIError):
    """429: the tenant's quota (live sandboxes, memory) or a sandbox limit."""


class InternalError(APIError):
    """500: opaque; the daemon's log has details under the request id."""


class NotImplementedByDaemonError(APIError):
    """501 ``not_implemented``: a feature this daemon was built without."""


class BadGatewayError(APIError):
    """502 ``bad_gateway``: a sandbox port refused the connection or did not answer HTTP."""


class GatewayTimeoutError(APIError, TimeoutError):
    """504 ``gateway_timeout`` (dialling a sandbox port took too long) or
    ``timeout`` (a code context's interpreter did not start in time)."""


class UnavailableError(APIError):
    """503: no capacity, or the daemon is shutting down."""


class HostExhaustedError(UnavailableError):
    """503 ``host_exhausted``: the host ran out of file descriptors, memory or disk
    space (the message names which); nothing of the request was kept, so a later
    retry may succeed."""


class NoSpaceError(APIError):
    """507: the sandbox's disk (writable layer) is full."""


class IngestError(APIError):
    """Reading a collection's source failed (422 ``ingest_failed``); the collection is unchanged."""


class ProtocolError(SandlotError):
    """The daemon answered something this SDK does not understand."""


class StreamError(APIError):
    """An ``error`` line ended an output or watch stream."""


class ProcessTimeoutError(SandlotError, TimeoutError):
    """``Process.wait(timeout=...)`` expired; the process still runs."""


class CommandError(SandlotError):
    """``run(..., check=True)``: the command failed. ``result`` holds its output."""

    def __init__(self, result: "RunResult") -> None:
        self.result = result
        super().__init__(self._describe(result))

    @staticmethod
    def _describe(r: "RunResult") -> str:
        if r.exit.timed_out:
            what = "timed out"
        elif r.exit.signal is not None:
            what = f"was killed by signal {r.exit.signal}"
        else:
            what = f"exited with code {r.exit_code}"
        tail = r.stderr.strip().splitlines()[-3:] if r.stderr else []
        more = (": " + " | ".join(tail)) if tail else ""
        return f"command {list(r.argv)!r} {what}{more}"

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def stdout(self) -> str:
        return self.result.stdout

    @property
    def stderr(self) -> str:
        return self.result.stderr


class CommandTimeoutError(CommandError, TimeoutError):
    """``run(..., check=True, timeout=...)``: the command ran out of time and was killed."""


# Every code the daemon answers (a test of the daemon holds this map to its list).
_BY_CODE: Dict[str, Type[APIError]] = {
    "bad_request": BadRequestError,
    "spawn_failed": SpawnError,
    "invalid_user": InvalidUserError,
    "kernel_unavailable": KernelUnavailableError,
    "unauthorized": AuthError,
    "permission_denied": PermissionDeniedError,
    "forbidden": ForbiddenError,
    "not_found": NotFoundError,
    "method_not_allowed": MethodNotAllowedError,
    "conflict": ConflictError,
    "invalid_state": InvalidStateError,
    "pause_refused": PauseRefusedError,
    "checkpoint_damaged": CheckpointDamagedError,
    "lifetime_exceeded": LifetimeExceededError,
    "busy": ConflictError,
    "already_exists": AlreadyExistsError,
    "not_a_directory": NotADirectoryError_,
    "is_a_directory": IsADirectoryError_,
    "directory_not_empty": DirectoryNotEmptyError,
    "process_exited": ProcessExitedError,
    "gone": GoneError,
    "payload_too_large": PayloadTooLargeError,
    "too_large": PayloadTooLargeError,
    "unsupported_media_type": UnsupportedMediaTypeError,
    "ingest_failed": IngestError,
    "build_failed": BuildFailedError,
    "idempotency_mismatch": IdempotencyMismatchError,
    "io": SandboxIOError,
    "quota_exceeded": QuotaExceededError,
    "limit": QuotaExceededError,
    "internal": InternalError,
    "not_implemented": NotImplementedByDaemonError,
    "bad_gateway": BadGatewayError,
    "unavailable": UnavailableError,
    "host_exhausted": HostExhaustedError,
    "gateway_timeout": GatewayTimeoutError,
    "timeout": GatewayTimeoutError,
    "no_space": NoSpaceError,
}

_BY_STATUS: Dict[int, Type[APIError]] = {
    400: BadRequestError,
    401: AuthError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    410: GoneError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: IngestError,
    429: QuotaExceededError,
    500: InternalError,
    503: UnavailableError,
    507: NoSpaceError,
}


def error_class(status: int, code: str, field: Optional[str]) -> Type[APIError]:
    """The exception class for an API error."""
    if code == "bad_request":
        return InvalidSpecError if field else BadRequestError
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        cls = InternalError if status >= 500 else APIError
    return cls


def from_body(status: int, body: Any, request_id: Optional[str], fallback: str) -> APIError:
    """Builds the exception for an error response (``body`` parsed JSON or None)."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code = str(err.get("code") or "unknown")
        message = str(err.get("message") or fallback)
        field = err.get("field")
        rid = err.get("request_id") or request_id
    else:
        code, message, field, rid = "unknown", fallback, None, request_id
    cls = error_class(status, code, field)
    return cls(message, status=status, code=code, request_id=rid, field=field)


def from_stream_error(err: Dict[str, Any]) -> StreamError:
    """The exception for an ``{"type": "error"}`` line of a stream."""
    return StreamError(
        str(err.get("message") or "stream error"),
        status=0,
        code=str(err.get("code") or "unknown"),
        request_id=err.get("request_id"),
        field=err.get("field"),
    )
