"""One file per model: a JSON header (config, versions, dtype) and the tensors (parameters, posterior cache,
scaling), framed and checksummed so that a truncated, corrupt or foreign file is recognised as such.

Layout: ``MAGIC | u32 format | u64 header length | header JSON | u64 payload length | payload | sha256``, where
the payload is ``torch.save`` of a dict of tensors, read back with ``weights_only=True`` (no arbitrary pickles),
and the sha256 covers everything before it. Files are written to a temporary name and renamed, so a crash
never leaves half a model behind.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import struct
import tempfile
from pathlib import Path

import torch

from ._version import __version__

__all__ = ["ModelFileError", "write_model_file", "read_model_file", "check_writable", "write_atomically",
           "FORMAT_VERSION"]

MAGIC = b"GPSCALE\x00"
FORMAT_VERSION = 1
_DIGEST = 32


class ModelFileError(ValueError):
    """The file is not a readable gpscale model."""


def write_model_file(path: str | os.PathLike, header: dict, tensors: dict) -> None:
    """Write ``header`` (JSON-serialisable) and ``tensors`` (nested dicts of tensors) to ``path`` atomically."""
    header_bytes = json.dumps(header, sort_keys=True).encode("utf-8")
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    payload = buffer.getvalue()
    body = b"".join([
        MAGIC,
        struct.pack("<I", FORMAT_VERSION),
        struct.pack("<Q", len(header_bytes)), header_bytes,
        struct.pack("<Q", len(payload)), payload,
    ])
    write_atomically(path, lambda f: f.write(body + hashlib.sha256(body).digest()))


def write_atomically(path: str | os.PathLike, write, text: bool = False) -> None:
    """Call ``write(f)`` on a temporary file beside ``path`` and move it into place: ``path`` holds either its
    earlier content or the whole new one, whatever interrupts the write. The temporary file goes on failure, and
    those of writes killed outright (SIGKILL, power loss) go at the next write to the same path.

    ``f`` is a binary file, or with ``text`` a UTF-8 text file that writes line ends as given (what :mod:`csv`
    needs). An OSError while writing (a full disk, a quota, a read-only file system) is raised as an OSError of the
    same errno whose message names ``path``, says that its earlier content is left as it was, and what to do."""
    path = Path(path)
    check_writable(path)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    existed = path.exists()
    try:
        _write_and_replace(path, write, text)
    except OSError as err:
        raise _write_error(path, existed, err) from err


def _write_and_replace(path: Path, write, text: bool) -> None:
    """Write a temporary file beside ``path`` with ``write``, sync it to disk and rename it to ``path``; remove it
    on failure."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, _mode_for(path))  # mkstemp's 0600, else: the file's own mode, or what open() would give
        with os.fdopen(fd, "w", encoding="utf-8", newline="") if text else os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    """The permissions a file written at ``path`` keeps: those of the file there, else ``0o666`` less the umask."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0o022)  # read by setting it, and put back at once
        os.umask(umask)
        return 0o666 & ~umask


def _write_error(path: Path, existed: bool, err: OSError) -> OSError:
    """``err``, raised while writing ``path``, as an OSError of the same errno (and so the same subclass) whose
    message names the path, what became of it and what to do."""
    kept = f"the earlier {path.name} is left as it was" if existed else "nothing was written there"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        remedy = "Free space on that disk (or raise the quota), or write to another folder."
    elif err.errno == errno.EFBIG:
        remedy = "Write to a file system that takes files this large, or raise your file-size limit."
    elif err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        remedy = "Write to a folder you can write to."
    else:
        remedy = "Check that disk, or write to another folder."
    message = f"could not write {path} ({err.strerror or err}); {kept}. {remedy}"
    return OSError(err.errno, message) if err.errno is not None else OSError(message)


def check_writable(path: str | os.PathLike) -> None:
    """Raise OSError unless a file can be written at ``path``: checked before work whose result goes there."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file name to write.")
    if not folder.is_dir():
        raise FileNotFoundError(f"{path}: the folder {folder} does not exist; create it first.")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"{path}: the folder {folder} is not writable.")


def read_model_file(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> tuple[dict, dict]:
    """Read ``(header, tensors)`` back; :class:`ModelFileError` says what is wrong with a bad file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such model file.") from None
    except IsADirectoryError:
        raise ModelFileError(f"{path} is a directory, not a gpscale model file.") from None
    if not data.startswith(MAGIC):
        raise ModelFileError(f"{path} is not a gpscale model file (it does not start with the gpscale marker).")
    if len(data) < len(MAGIC) + 4 + 8 + _DIGEST:
        raise ModelFileError(f"{path} is truncated ({len(data)} bytes): save the model again.")
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise ModelFileError(f"{path} is corrupt or truncated (checksum mismatch): save the model again.")
    offset = len(MAGIC)
    (version,) = struct.unpack_from("<I", body, offset)
    if version > FORMAT_VERSION:
        raise ModelFileError(f"{path} uses model-file format {version}, newer than this gpscale reads "
                             f"({FORMAT_VERSION}): upgrade gpscale.")
    offset += 4
    try:
        (header_len,) = struct.unpack_from("<Q", body, offset)
        offset += 8
        header = json.loads(body[offset:offset + header_len].decode("utf-8"))
        offset += header_len
        (payload_len,) = struct.unpack_from("<Q", body, offset)
        offset += 8
        tensors = torch.load(io.BytesIO(body[offset:offset + payload_len]), map_location=map_location,
                             weights_only=True)
    except Exception as err:  # noqa: BLE001 - whatever the bytes hold, the file is unreadable, and says so
        raise ModelFileError(f"{path} has a valid checksum but cannot be read ({type(err).__name__}: {err}); it "
                             "was not written by gpscale's save, or by an incompatible version.") from err
    if not isinstance(header, dict):
        raise ModelFileError(f"{path} holds a header that is not a JSON object; it was not written by gpscale.")
    _check_major_version(path, header.get("gpscale_version"))
    return header, tensors


def _check_major_version(path: Path, written_by) -> None:
    """Refuse a file written by a newer major version of gpscale, whose model state this one may misread."""
    try:
        theirs, ours = int(str(written_by).split(".")[0]), int(__version__.split(".")[0])
    except ValueError:  # no version recorded (or not a number): the format version above decides
        return
    if theirs > ours:
        raise ModelFileError(f"{path} was written by gpscale {written_by}, a newer major version than this one "
                             f"({__version__}): upgrade gpscale to read it.")
