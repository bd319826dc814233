"""The state a process's output stream moves, shared by the sync ``Process`` and
the async ``AsyncProcess`` (which add the reading, the locking or the tasks, and
the callbacks): the lines of an exec or output stream decoded into events, the
offsets read so far (a re-attach resumes from them, and what it sends again is
dropped), and the chunks that wait until the reader chooses between reading
stdout and stderr apart or merged."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from . import errors
from .models import ExitStatus, OutputChunk, ProcessInfo, decode_chunk

SPLIT = "split"
MERGED = "merged"


@dataclass(frozen=True)
class Exited:
    """The process's exit status arrived."""

    status: ExitStatus


@dataclass(frozen=True)
class Started:
    """The process's record, sent again at the start of a stream."""

    info: ProcessInfo


Event = Union[OutputChunk, Exited, Started]


class OutputState:
    """What a process's output stream has delivered so far. Not thread-safe: the
    sync process calls it under its lock, the async one from its reader task."""

    def __init__(self, from_offsets: "tuple[int, int]" = (0, 0)) -> None:
        self.offsets = {"stdout": from_offsets[0], "stderr": from_offsets[1]}
        # SPLIT (stdout and stderr read apart), MERGED (iter_output), or None
        # until the first reader chooses; chunks wait in arrival order till then.
        self.mode: Optional[str] = None
        self.pending: List[OutputChunk] = []

    def params(self) -> Dict[str, int]:
        """The query of a re-attach: from the offsets received."""
        return {"stdout_from": self.offsets["stdout"], "stderr_from": self.offsets["stderr"]}

    def event(self, line: str) -> Optional[Event]:
        """The event of one stream line: a new chunk (its part not delivered before a
        re-attach), the exit, the process's record; None for an empty line, a chunk
        already delivered or a line that only moves the offsets. A stream error
        raises it."""
        if not line:
            return None
        ev: Dict[str, Any] = json.loads(line)
        kind = ev.get("type")
        if kind in ("stdout", "stderr"):
            return self._fresh(decode_chunk(ev))
        if kind == "exit":
            return Exited(ExitStatus.from_json(ev.get("exit") or {}))
        if kind == "error":
            raise errors.from_stream_error(ev.get("error") or {})
        if kind == "attached":
            self.offsets["stdout"] = max(self.offsets["stdout"], int(ev.get("stdout_from", 0)))
            self.offsets["stderr"] = max(self.offsets["stderr"], int(ev.get("stderr_from", 0)))
        elif kind == "started" and "process" in ev:
            return Started(ProcessInfo.from_json(ev["process"]))
        return None

    def _fresh(self, c: OutputChunk) -> Optional[OutputChunk]:
        seen = self.offsets[c.stream]
        end = c.offset + len(c.data)
        if end <= seen:
            return None
        data = c.data[seen - c.offset :] if c.offset < seen else c.data
        self.offsets[c.stream] = end
        return OutputChunk(stream=c.stream, data=data, offset=end - len(data))

    def hold(self, c: OutputChunk) -> bool:
        """Keeps ``c`` for the reader's choice; False once it is made (route it)."""
        if self.mode is None:
            self.pending.append(c)
            return True
        return False

    def choose(self, mode: str) -> List[OutputChunk]:
        """Makes the reader's choice (again, the same, is nothing); the chunks held
        till now, to route in order."""
        if self.mode is None:
            self.mode = mode
            held, self.pending = self.pending, []
            return held
        if self.mode != mode:
            raise RuntimeError(
                "a process's output is read either through stdout/stderr or through iter_output(), not both"
            )
        return []
