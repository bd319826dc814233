"""Code contexts: stateful interpreters (Jupyter kernels) inside a sandbox, and
runs of code in them with rich results (``sb.run_code("df.describe()")``)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from . import _spec, errors
from .models import parse_time

DEFAULT_CONTEXT = "default"


@dataclass(frozen=True)
class CodeContext:
    """A stateful interpreter in a sandbox (``state``: idle, busy or stopped)."""

    id: str
    language: str
    cwd: Optional[str]
    state: str
    restarts: int
    created_at: Optional[datetime]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "CodeContext":
        return cls(
            id=str(d["id"]),
            language=str(d.get("language", "python")),
            cwd=d.get("cwd"),
            state=str(d.get("state", "")),
            restarts=int(d.get("restarts", 0)),
            created_at=parse_time(d.get("created_at")),
            raw=d,
        )


@dataclass(frozen=True)
class Result:
    """One rich result: a MIME bundle. ``is_main_result`` is the value of the cell's
    last expression; ``display()`` output has it false."""

    is_main_result: bool
    data: Dict[str, Any]

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Result":
        return cls(is_main_result=bool(d.get("is_main_result")), data=dict(d.get("data") or {}))

    def _text(self, mime: str) -> Optional[str]:
        v = self.data.get(mime)
        return v if isinstance(v, str) else None

    @property
    def text(self) -> Optional[str]:
        return self._text("text/plain")

    @property
    def html(self) -> Optional[str]:
        return self._text("text/html")

    @property
    def markdown(self) -> Optional[str]:
        return self._text("text/markdown")

    @property
    def svg(self) -> Optional[str]:
        return self._text("image/svg+xml")

    @property
    def latex(self) -> Optional[str]:
        return self._text("text/latex")

    @property
    def png(self) -> Optional[str]:
        """The PNG as base64 (``png_bytes`` decodes it)."""
        return self._text("image/png")

    @property
    def png_bytes(self) -> Optional[bytes]:
        p = self.png
        return base64.b64decode(p) if p is not None else None

    @property
    def jpeg(self) -> Optional[str]:
        return self._text("image/jpeg")

    @property
    def json(self) -> Any:
        return self.data.get("application/json")

    @property
    def chart(self) -> Optional[Dict[str, Any]]:
        """A matplotlib figure's chart data (``type``, ``title``, ``elements``, axis
        labels, ticks and scales; the format of E2B's ``Result.chart``), when it is one."""
        c = self.data.get("application/vnd.sandlot.chart+json")
        return c if isinstance(c, dict) else None

    @property
    def dataframe(self) -> Optional[Dict[str, Any]]:
        """A pandas DataFrame's data (``columns``, ``index``, ``data``), when it is one."""
        j = self.data.get("application/json")
        if isinstance(j, dict) and {"columns", "index", "data"} <= set(j):
            return j
        return None

    def formats(self) -> List[str]:
        return sorted(self.data)


@dataclass(frozen=True)
class ExecutionError:
    """An exception the cell raised (``KernelDied`` when the interpreter ended,
    ``TimeoutError`` when the run's timeout expired)."""

    name: str
    value: str
    traceback: str

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExecutionError":
        return cls(name=str(d.get("name", "")), value=str(d.get("value", "")), traceback=str(d.get("traceback", "")))


@dataclass
class Execution:
    """The outcome of a run. ``status``: ``ok``, ``error``, ``timed_out`` or
    ``crashed``; ``restarted``: the interpreter was started again before this run,
    so earlier state is gone; ``truncated``: output past the daemon's cap was left out."""

    results: List[Result] = field(default_factory=list)
    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    status: str = "ok"
    restarted: bool = False
    truncated: bool = False

    @property
    def text(self) -> Optional[str]:
        """The ``text/plain`` of the main result (the last expression's value)."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def main_result(self) -> Optional[Result]:
        return next((r for r in self.results if r.is_main_result), None)


OnText = Callable[[str], Any]
OnResult = Callable[[Result], Any]
OnError = Callable[[ExecutionError], Any]


@dataclass
class Callbacks:
    on_stdout: Optional[OnText] = None
    on_stderr: Optional[OnText] = None
    on_result: Optional[OnResult] = None
    on_error: Optional[OnError] = None


def context_id(context: Union[None, str, CodeContext]) -> str:
    if context is None:
        return DEFAULT_CONTEXT
    return context.id if isinstance(context, CodeContext) else str(context)


def create_body(language: Optional[str], cwd: Optional[str], env: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if language is not None:
        body["language"] = language
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    return body


def run_body(code: str, timeout: Optional[_spec.Duration], env: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"code": code}
    if timeout is not None:
        body["timeout"] = _spec.duration(timeout)
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    return body


class Collector:
    """Folds a run's NDJSON events into its ``Execution``, calling the callbacks."""

    def __init__(self, callbacks: Callbacks) -> None:
        self.cb = callbacks
        self.x = Execution()
        self.ended = False

    def feed(self, line: str) -> List[Any]:
        """Takes one line; returns what the callbacks returned (awaitables for async)."""
        if not line:
            return []
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise errors.ProtocolError(f"a run line is not JSON: {line[:200]!r}") from e
        kind = ev.get("type")
        out: List[Any] = []
        if kind == "error":
            raise errors.from_stream_error(ev.get("error") or {})
        if kind == "started":
            self.x.restarted = bool(ev.get("restarted"))
        elif kind == "stdout":
            self.x.stdout.append(str(ev.get("text", "")))
            if self.cb.on_stdout is not None:
                out.append(self.cb.on_stdout(self.x.stdout[-1]))
        elif kind == "stderr":
            self.x.stderr.append(str(ev.get("text", "")))
            if self.cb.on_stderr is not None:
                out.append(self.cb.on_stderr(self.x.stderr[-1]))
        elif kind == "result":
            r = Result.from_json(ev.get("result") or {})
            self.x.results.append(r)
            if self.cb.on_result is not None:
                out.append(self.cb.on_result(r))
        elif kind == "exception":
            raised = ExecutionError.from_json(ev.get("error") or {})
            if self.cb.on_error is not None:
                out.append(self.cb.on_error(raised))
        elif kind == "end":
            err = ev.get("error")
            self.x.error = ExecutionError.from_json(err) if err else None
            self.x.execution_count = ev.get("execution_count")
            self.x.status = str(ev.get("status", "ok"))
            self.x.restarted = bool(ev.get("restarted"))
            self.x.truncated = bool(ev.get("truncated"))
            if err and self.x.status in ("timed_out", "crashed") and self.cb.on_error is not None:
                out.append(self.cb.on_error(self.x.error))  # type: ignore[arg-type]
            self.ended = True
        return out

    def result(self) -> Execution:
        if not self.ended:
            raise errors.ProtocolError("the run's stream ended before its 'end' line")
        return self.x


def contexts_of(d: Any) -> List[CodeContext]:
    items: Iterable[Dict[str, Any]] = (d or {}).get("contexts", [])
    return [CodeContext.from_json(c) for c in items]
