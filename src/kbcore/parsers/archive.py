"""Zip archives: limits every zip-based format shares, and ``.zip`` files as many documents.

:func:`check_zip` opens a zip (a ``.zip``, or the container of a ``.docx`` / ``.xlsx`` /
``.pptx``) and refuses it before anything is unpacked when it is not a zip, or when its
directory declares more than :data:`MAX_MEMBERS` members, more than :data:`MAX_UNPACKED`
bytes unpacked in total (:data:`MAX_OFFICE_UNPACKED` for an office file), or a member
larger than 1 MiB compressed more than :data:`MAX_RATIO` times (a zip bomb). Python's
:mod:`zipfile` stops every member at its declared size and checks its CRC, so the declared
sizes bound what is unpacked.

:func:`parse_archive` parses the members of a ``.zip``: every member whose extension is a
supported format becomes its own document, named by its path inside the archive. Directories,
``__MACOSX/`` and dot-files are ignored; members of other types, legacy Office files and
nested archives (which are not followed) are skipped and reported with the reason. The archive
is all-or-nothing: a member path that escapes the archive (``../x``, ``/x``, ``C:x``), a
supported member that fails to parse, or an archive with no supported member refuses the whole
archive, naming the member and the reason.
"""

from __future__ import annotations

import io
import os
import posixpath
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError

__all__ = [
    "MAX_MEMBERS",
    "MAX_UNPACKED",
    "MAX_OFFICE_UNPACKED",
    "MAX_RATIO",
    "ArchiveMember",
    "ParsedArchive",
    "check_zip",
    "parse_archive",
]

#: The most members a zip may declare.
MAX_MEMBERS = 5000
#: The most bytes all members of a zip may declare unpacked (256 MiB).
MAX_UNPACKED = 256 << 20
#: The same for the zip inside a .docx / .xlsx / .pptx (64 MiB): their XML is parsed whole.
MAX_OFFICE_UNPACKED = 64 << 20
#: The largest unpacked / compressed ratio of a member over 1 MiB unpacked.
MAX_RATIO = 100
_RATIO_FLOOR = 1 << 20


@dataclass(frozen=True, slots=True)
class ArchiveMember:
    """One parsed member of an archive: its path inside the archive and what it parsed to."""

    path: str
    parsed: Any  # kbcore.parsing.ParsedDocument


@dataclass(frozen=True, slots=True)
class ParsedArchive:
    """The parsed members of an archive, in archive order, and the skipped ones with why."""

    members: tuple[ArchiveMember, ...]
    skipped: tuple[tuple[str, str], ...]


def _name(filename: str | None) -> str:
    return repr(filename) if filename else "the input"


def check_zip(
    data: bytes, filename: str | None, what: str = "zip archive", max_unpacked: int = MAX_UNPACKED
) -> zipfile.ZipFile:
    """The open zip of ``data`` after the limits above (``max_unpacked`` for the total) were
    checked on its directory."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        raise InvalidArgumentError(f"{_name(filename)}: not a valid {what} ({exc})") from None
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise InvalidArgumentError(
            f"{_name(filename)}: the {what} has {len(infos)} members, more than the limit of {MAX_MEMBERS}"
        )
    total = 0
    for info in infos:
        total += info.file_size
        if info.file_size > _RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise InvalidArgumentError(
                f"{_name(filename)}: member {info.filename!r} unpacks {info.file_size} bytes from "
                f"{info.compress_size} (more than {MAX_RATIO}x): refused as a likely zip bomb"
            )
    if total > max_unpacked:
        raise InvalidArgumentError(
            f"{_name(filename)}: the {what} unpacks to {total} bytes, more than the limit of {max_unpacked}"
        )
    return zf


def _unsafe(path: str) -> bool:
    if path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":") or "\x00" in path:
        return True
    return any(p == ".." for p in path.replace("\\", "/").split("/"))


def _ignored(path: str) -> bool:
    parts = [p for p in path.split("/") if p]
    return not parts or parts[0] == "__MACOSX" or any(p.startswith(".") for p in parts)


def parse_archive(
    data: bytes,
    filename: str | None,
    parse: Callable[..., Any],
    extensions: dict[str, str],
    legacy: dict[str, str],
) -> ParsedArchive:
    """The parsed members of a zip archive (see the module docstring). ``parse`` is
    :func:`kbcore.parsing.parse`, ``extensions`` its extension table and ``legacy`` the
    refused legacy extensions with their modern format."""
    zf = check_zip(data, filename)
    members: list[ArchiveMember] = []
    skipped: list[tuple[str, str]] = []
    seen: set[str] = set()
    with zf:
        for info in zf.infolist():
            path = info.filename
            if _unsafe(path):
                raise InvalidArgumentError(
                    f"{_name(filename)}: member {path!r} points outside the archive; the archive was not ingested"
                )
            if info.is_dir() or _ignored(path):
                continue
            path = posixpath.normpath(path)
            ext = os.path.splitext(path)[1].lower()
            if ext == ".zip" or extensions.get(ext) == "zip":
                skipped.append((path, "a nested archive (not followed)"))
                continue
            if ext in legacy:
                skipped.append((path, f"legacy {ext} format (convert it to {legacy[ext]})"))
                continue
            if ext not in extensions:
                skipped.append((path, f"unsupported file type {ext!r}" if ext else "no file extension"))
                continue
            if info.file_size == 0:
                skipped.append((path, "an empty file"))
                continue
            if path in seen:
                raise InvalidArgumentError(f"{_name(filename)}: member {path!r} appears twice")
            seen.add(path)
            try:
                body = zf.read(info)
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as exc:
                # RuntimeError: an encrypted member (zipfile asks for a password)
                raise InvalidArgumentError(
                    f"{_name(filename)}: member {path!r} cannot be unpacked ({exc}); the archive was not ingested"
                ) from None
            label = f"{filename or 'archive'}/{path}"
            try:
                parsed = parse(body, filename=label)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"{exc}; the archive {_name(filename)} was not ingested") from None
            members.append(ArchiveMember(path, parsed))
    if not members:
        why = "; ".join(f"{p}: {r}" for p, r in skipped[:10]) or "it is empty"
        raise InvalidArgumentError(f"{_name(filename)}: the archive holds no file of a supported type ({why})")
    return ParsedArchive(tuple(members), tuple(skipped))
