"""llama.cpp's tokenizer test suite, from the llama-cpp-python 0.3.36 source distribution.

The sdist (77 MB) is downloaded once from pip's package index (its simple page, PEP 503; the file's sha256
checked) into ``$PRISM_CACHE`` (default ``~/.cache/prism``), outside the repository, and the files the tests
read are unpacked next to it:
``vendor/llama.cpp/models/ggml-vocab-*.gguf`` with their ``.inp``/``.out`` test files.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urljoin

PACKAGE, VERSION = "llama-cpp-python", "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
PREFIX = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
SEPARATOR = "\n__ggml_vocab_test__\n"


class RegistryUnreachable(RuntimeError):
    """The package index could not be reached: the only reason the peer suite may skip."""


def _index_url() -> str:
    """pip's index: $PIP_INDEX_URL, else pip's configured global.index-url, else PyPI."""
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        r = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                           capture_output=True, text=True)
        url = r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "https://pypi.org/simple"
    return url.rstrip("/")


def _download(dest: Path) -> None:
    """The sdist from the index's simple page into dest, its sha256 checked. Not ``pip download``: for an sdist
    pip first builds the package's metadata in an isolated environment (scikit-build-core, cmake), 25 s of CPU.
    Raises RegistryUnreachable when the index cannot be reached; any other failure raises RuntimeError."""
    page_url = f"{_index_url()}/{PACKAGE}/"
    try:
        with urllib.request.urlopen(page_url, timeout=60) as r:
            page, base = r.read().decode("utf-8", "replace"), r.geturl()
        link = re.search(r'href="([^"]*' + re.escape(SDIST) + r'(?:#[^"]*)?)"', page)
        if link is None:
            raise RuntimeError(f"{page_url} lists no {SDIST}")
        url, _, fragment = urljoin(base, link.group(1).replace("&amp;", "&")).partition("#")
        part = dest.with_name(dest.name + ".part")
        digest = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=60) as r, open(part, "wb") as f:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
    except urllib.error.HTTPError as e:  # the index answered: not a reason to skip
        raise RuntimeError(f"downloading {SDIST} from {page_url}: {e}") from e
    except (urllib.error.URLError, OSError) as e:
        raise RegistryUnreachable(f"the package index could not be reached for {PACKAGE}=={VERSION} "
                                  f"({page_url}: {getattr(e, 'reason', e)})") from e
    want = dict(kv.split("=", 1) for kv in fragment.split("&") if "=" in kv).get("sha256")
    if want and digest.hexdigest() != want:
        part.unlink()
        raise RuntimeError(f"{url}: sha256 {digest.hexdigest()}, the index says {want}")
    part.replace(dest)


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
    Raises RegistryUnreachable when the index cannot be reached; any other failure raises RuntimeError."""
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
            _download(sdist)
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
