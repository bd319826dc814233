"""Safe extraction of a tar from a sandbox: nothing may land outside the target."""

from __future__ import annotations

import os
import tarfile
from typing import IO, List


def extract_tar(fileobj: IO[bytes], dest: str) -> List[str]:
    """Extracts regular files and directories under ``dest``; refuses absolute
    names, ``..`` and links (a sandbox's tar is untrusted input)."""
    root = os.path.realpath(dest)
    names: List[str] = []
    with tarfile.open(fileobj=fileobj, mode="r:") as tar:
        members = []
        for m in tar.getmembers():
            name = m.name
            target = os.path.realpath(os.path.join(root, name))
            if os.path.isabs(name) or (target != root and not target.startswith(root + os.sep)):
                raise ValueError(f"tar entry {name!r} would land outside {dest}")
            if not (m.isfile() or m.isdir()):
                continue  # links, devices, fifos: never materialized locally
            m.mode = (m.mode or 0o644) & 0o777
            members.append(m)
            names.append(name)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, members=members, filter="data")
        else:  # pragma: no cover - Pythons without PEP 706
            tar.extractall(root, members=members)
    return names
