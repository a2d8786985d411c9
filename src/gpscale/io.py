"""One file per model: a JSON header (config, versions, dtype) and the tensors (parameters, posterior cache,
scaling), framed and checksummed so that a truncated, corrupt or foreign file is recognised as such.

Layout: ``MAGIC | u32 format | u64 header length | header JSON | u64 payload length | payload | sha256``, where
the payload is ``torch.save`` of a dict of tensors, read back with ``weights_only=True`` (no arbitrary pickles),
and the sha256 covers everything before it. Files are written to a temporary name and renamed, so a crash
never leaves half a model behind.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tempfile
from pathlib import Path

import torch

__all__ = ["ModelFileError", "write_model_file", "read_model_file", "FORMAT_VERSION"]

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
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body + hashlib.sha256(body).digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    (header_len,) = struct.unpack_from("<Q", body, offset)
    offset += 8
    header = json.loads(body[offset:offset + header_len].decode("utf-8"))
    offset += header_len
    (payload_len,) = struct.unpack_from("<Q", body, offset)
    offset += 8
    tensors = torch.load(io.BytesIO(body[offset:offset + payload_len]), map_location=map_location,
                         weights_only=True)
    return header, tensors
