"""Download WikiText-2 (word level, v1) once, on a machine with internet, into a flat directory.

Compute nodes of most clusters are offline, so this runs on a login node (``exatrain data prepare
wikitext-2 --out DIR``) and training points ``data.path`` at ``DIR``. The result is all or nothing:
the download and extraction happen in a hidden staging directory next to ``DIR`` and the three files
are renamed into place only after the archive has been verified.
"""

from __future__ import annotations

import http.client
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from exatrain.errors import DataError

WIKITEXT2_URLS = (
    "https://wikitext.smerity.com/wikitext-2-v1.zip",
    "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip",
)
WIKITEXT2_FILES = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")
_CHUNK = 1 << 16


def prepare_wikitext2(
    out_dir: str | os.PathLike,
    url: str | None = None,
    timeout: float = 30.0,
    force: bool = False,
    log: IO[str] | None = None,
) -> Path:
    """Download and unpack WikiText-2 into ``out_dir`` (flat: wiki.{train,valid,test}.tokens); return it.

    ``url`` replaces the default mirrors (tried in order: :data:`WIKITEXT2_URLS`); ``file://`` URLs of a
    zip copied by hand work too. If ``out_dir`` already holds the three files nothing is downloaded
    unless ``force``. Progress goes to ``log`` (default stderr). Any failure raises DataError naming
    every URL tried and why it failed, and leaves ``out_dir`` as it was (not created if it was absent).
    """
    log = log or sys.stderr
    out = Path(out_dir).expanduser().absolute()
    if not force and all((out / f).is_file() for f in WIKITEXT2_FILES):
        print(f"WikiText-2 already in {out}; nothing to do", file=log, flush=True)
        return out
    urls = [url] if url else list(WIKITEXT2_URLS)

    created = _make_parents(out.parent)
    staging = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        failures: list[str] = []
        for u in urls:
            extracted = staging / "files"
            try:
                archive = staging / "wikitext-2-v1.zip"
                _download(u, archive, timeout, log)
                _extract(archive, extracted)
            except _Failed as exc:
                failures.append(f"{u}: {exc}")
                print(f"failed: {u}: {exc}", file=log, flush=True)
                shutil.rmtree(extracted, ignore_errors=True)
                continue
            _install(extracted, out)
            print(f"WikiText-2 ready in {out}", file=log, flush=True)
            return out
        raise DataError(
            f"could not download WikiText-2 into {out}; tried:\n  " + "\n  ".join(failures),
            "run `exatrain data prepare wikitext-2 --out DIR` on a machine with internet access "
            "(e.g. a login node; "
            "compute nodes are often offline) and set data.path to DIR; or copy wiki.train.tokens, "
            "wiki.valid.tokens and wiki.test.tokens into DIR by hand (or pass the file:// URL of a "
            "wikitext-2-v1.zip fetched elsewhere)",
        )
    except OSError as exc:
        raise DataError(
            f"cannot write WikiText-2 to {out}: {exc.strerror or exc}",
            "choose an --out directory on a writable filesystem with ~15 MB free",
        ) from exc
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if not all((out / f).is_file() for f in WIKITEXT2_FILES):
            for d in reversed(created):
                try:
                    d.rmdir()
                except OSError:
                    break


class _Failed(Exception):
    """One mirror did not deliver a usable archive (the message says why)."""


def _make_parents(path: Path) -> list[Path]:
    """mkdir -p ``path``; return the directories that were created (outermost first)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    missing.reverse()
    for d in missing:
        try:
            d.mkdir()
        except FileExistsError:
            pass
    return missing


def _download(url: str, dest: Path, timeout: float, log: IO[str]) -> None:
    """Fetch ``url`` into ``dest`` with a progress line about every 10 %; raise _Failed on any network
    error."""
    print(f"downloading {url}", file=log, flush=True)
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "exatrain-data-prepare"})
        with urllib.request.urlopen(req, timeout=timeout) as resp, open(dest, "wb") as fh:
            total = int(resp.headers.get("Content-Length") or 0)
            step = max(total // 10, 1) if total else 4 << 20
            got, reported = 0, 0
            while True:
                chunk = resp.read(_CHUNK)
                if not chunk:
                    break
                fh.write(chunk)
                got += len(chunk)
                if got - reported >= step:
                    print(_progress(got, total), file=log, flush=True)
                    reported = got
            if got != reported:
                print(_progress(got, total), file=log, flush=True)
            if total and got < total:
                raise _Failed(f"connection closed after {got} of {total} bytes")
    except urllib.error.HTTPError as exc:
        raise _Failed(f"HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        reason = exc.reason
        raise _Failed(
            f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
        ) from exc
    except TimeoutError as exc:
        raise _Failed(f"timed out after {timeout:g} s") from exc
    except (ConnectionError, http.client.HTTPException, ValueError) as exc:  # resets mid-transfer, bad URL
        raise _Failed(f"{type(exc).__name__}: {exc}") from exc


def _progress(got: int, total: int) -> str:
    if total:
        return f"  {_human(got)} / {_human(total)} ({100 * got // total}%)"
    return f"  {_human(got)}"


def _human(n: int) -> str:
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _extract(archive: Path, dest: Path) -> None:
    """Check that ``archive`` is a zip holding the three WikiText-2 files and unpack them flat into
    ``dest``."""
    try:
        with zipfile.ZipFile(archive) as zf:
            members = {Path(info.filename).name: info for info in zf.infolist() if not info.is_dir()}
            missing = [f for f in WIKITEXT2_FILES if f not in members]
            if missing:
                raise _Failed(
                    f"archive lacks {', '.join(missing)} (is this the word-level WikiText-2 v1 zip?)"
                )
            dest.mkdir()
            for name in WIKITEXT2_FILES:
                with zf.open(members[name]) as src, open(dest / name, "wb") as dst:
                    shutil.copyfileobj(src, dst, _CHUNK)
    except zipfile.BadZipFile as exc:
        raise _Failed(f"not a valid zip archive ({exc})") from exc
    except (zipfile.LargeZipFile, EOFError, RuntimeError) as exc:
        raise _Failed(f"cannot unpack archive ({exc})") from exc


def _install(src: Path, out: Path) -> None:
    """Move the verified files into ``out``: one rename of the directory if ``out`` is new, else file by
    file."""
    try:
        os.rename(src, out)  # atomic when out does not exist (or is an empty directory)
        return
    except OSError:
        if not out.is_dir():
            raise
    for name in WIKITEXT2_FILES:
        os.replace(src / name, out / name)


def files_present(out_dir: str | os.PathLike, names: Sequence[str] = WIKITEXT2_FILES) -> bool:
    """True if every file of ``names`` exists in ``out_dir`` (e.g. to skip a download)."""
    return all((Path(out_dir) / n).is_file() for n in names)
