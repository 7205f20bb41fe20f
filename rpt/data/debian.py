"""Debian packages as a source of long documents: fetched without root and without their dependencies.

Some real long documents of other domains than code (novels, a bible, mathematical manuals and proof libraries) are
packaged by Debian, whose archive is reachable where a model or data hub may not be. A package is fetched once into
a cache folder and read from there on every later run (no network):

    apt-get download PKG                  (run in a temporary folder of the cache; apt checks the archive's signature
                                           and the file's checksum, and needs no root)
    dpkg -x PKG_<version>_<arch>.deb DIR  (only unpacks; without dpkg the .deb is unpacked here in Python: an `ar`
                                           archive holding data.tar.{xz,gz,bz2,zst})

Cache layout (default ``$RPT_CACHE_DIR/debian``, else ``$XDG_CACHE_HOME/rpt/debian``, else ``~/.cache/rpt/debian``,
beside the tokenizer cache of `rpt.data.tokenizer`)::

    <cache>/<package>/
        <package>_<version>_<arch>.deb
        root/           the unpacked tree (usr/...)
        package.json    name, version, .deb file and sha256, licence(s) read from the copyright file; written last

A package folder is built in a hidden ``.<package>.partial-*`` sibling and renamed into place when complete, so a
killed fetch never leaves a folder that looks complete; delete ``<cache>/<package>`` to fetch a newer version.

Provenance. The package's version comes from the .deb file name (apt names it ``name_version_arch.deb``, an epoch's
":" written "%3a"); its licence from ``usr/share/doc/<package>/copyright``: the short names of the ``License:``
fields of a machine-readable (DEP-5) file, and the one of its ``Files: *`` paragraph; an older free-text file is
searched for a GNU GPL/LGPL notice, else its licence is recorded as unknown with the file's path to read.

Every failure to fetch (no apt-get, an unknown package, no network, no dpkg and a format Python cannot unpack) is
one `PackageUnavailable` line that says what to run by hand and that an unpacked folder can be used instead.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from rpt.utils import UserError

FETCH_TIMEOUT_S = 900  # apt-get download of the largest package used (~25 MB) takes seconds on a normal link


class PackageUnavailable(UserError):
    """A Debian package could not be fetched or unpacked; the message is one line with the commands to run by hand."""


@dataclass(frozen=True)
class DebPackage:
    """An unpacked Debian package: where its files are and what the store's manifest records about it."""

    name: str
    root: Path  # the unpacked tree: the folder that holds usr/
    version: str | None = None  # None: unpacked by the user, no .deb seen
    deb: str | None = None  # the .deb file name
    sha256: str | None = None  # of the .deb
    license: str | None = None  # the licence of the copyright file's "Files: *" paragraph (or the only one found)
    licenses: tuple[str, ...] = ()  # every licence short name the copyright file names, in order
    license_source: str = "none"  # "dep5" (License: fields), "text" (a GPL/LGPL notice found), "none"
    copyright: str | None = None  # the copyright file, relative to root
    source: str = "apt"  # "apt" (fetched into the cache) or "folder" (given by the user)
    fetched: str | None = None

    def provenance(self) -> dict[str, Any]:
        """What a store's manifest records: enough to name, re-fetch and license-check the exact source."""
        out = asdict(self)
        out["root"] = str(self.root)
        out["licenses"] = list(self.licenses)
        return out


def cache_root() -> Path:
    """$RPT_CACHE_DIR/debian, else $XDG_CACHE_HOME/rpt/debian, else ~/.cache/rpt/debian."""
    if os.environ.get("RPT_CACHE_DIR"):
        return Path(os.environ["RPT_CACHE_DIR"]) / "debian"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "rpt" / "debian"


def manual_hint(package: str, cache: Path, spec: str | None) -> str:
    """The commands that fetch `package` by hand, and how to use the result (one line)."""
    name = spec or "<corpus>"
    return (f"fetch it by hand: cd {cache} && apt-get download {package} && mkdir -p {package}-root && "
            f"dpkg -x {package}_*.deb {package}-root (or unpack the .deb with `ar x` and `tar xf data.tar.*`), then "
            f"use --corpus {name}@{cache}/{package}-root (any folder where the package is unpacked works)")


def fetch(package: str, cache_dir: str | Path | None = None, spec: str | None = None) -> DebPackage:
    """The package unpacked in the cache, fetched with `apt-get download` on first use. spec: the corpus name, for the
    hint of the error. Raises PackageUnavailable (one line) when it cannot be fetched or unpacked."""
    cache = Path(cache_dir) if cache_dir is not None else cache_root()
    done = cache / package
    if _complete(done):
        return _load_record(done)

    def fail(why: str) -> PackageUnavailable:
        return PackageUnavailable(f"Debian package {package}: {why}; {manual_hint(package, cache, spec)}")

    apt = shutil.which("apt-get")
    if apt is None:
        raise fail("apt-get is not available here (not a Debian or Ubuntu system?)")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise fail(f"cannot create the cache folder {cache}: {e.strerror or e}") from None
    _remove_stale(cache, package)
    work = Path(tempfile.mkdtemp(prefix=f".{package}.partial-", dir=cache))
    try:
        try:
            r = subprocess.run([apt, "download", package], cwd=work, capture_output=True, text=True,
                               timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise fail(f"apt-get download timed out after {FETCH_TIMEOUT_S} s") from None
        debs = sorted(work.glob(f"{package}_*.deb"))
        if r.returncode != 0 or len(debs) != 1:
            why = _apt_error(r.stderr) or (f"exit status {r.returncode}" if r.returncode else
                                           f"it left {len(debs)} {package}_*.deb files")
            raise fail(f"`apt-get download {package}` failed: {why}")
        deb = debs[0]
        try:
            unpack_deb(deb, work / "root")
        except (OSError, EOFError, ValueError, tarfile.TarError, lzma.LZMAError, zlib.error) as e:
            raise fail(f"could not unpack {deb.name}: {e}") from None
        version = version_from_filename(deb.name, package)
        pkg = _describe(package, work / "root", version=version, deb=deb.name, sha256=_sha256(deb), source="apt",
                        fetched=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        record = pkg.provenance()
        record["root"] = str(done / "root")
        (work / "package.json").write_text(json.dumps(record, indent=2))
        work.chmod(0o755)  # mkdtemp makes it private; the cache is readable like the rest of ~/.cache
        if done.exists() and not _complete(done):  # e.g. its root/ deleted by hand: replaced by this fetch
            shutil.rmtree(done)
        try:
            os.replace(work, done)
        except OSError:
            if not _complete(done):
                raise fail(f"could not move the unpacked package to {done}") from None
            # else another run finished the same package first: use that one (ours is removed below)
        return _load_record(done)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _complete(done: Path) -> bool:
    return (done / "package.json").is_file() and (done / "root").is_dir()


def _remove_stale(cache: Path, package: str) -> None:
    """Delete the partial folders of fetches killed long ago (no live fetch is older than its timeout)."""
    for p in cache.glob(f".{package}.partial-*"):
        try:
            if time.time() - p.stat().st_mtime > 2 * FETCH_TIMEOUT_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def from_folder(package: str, folder: str | Path) -> DebPackage:
    """A package the user unpacked (``dpkg -x``) into `folder`, or the cache folder of one fetched before."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (expected {package} unpacked there, e.g. with dpkg -x)")
    if _complete(folder):
        return _load_record(folder)
    version = None
    debs = sorted(folder.parent.glob(f"{package}_*.deb")) + sorted(folder.glob(f"{package}_*.deb"))
    if len(debs) == 1:  # `apt-get download` beside `dpkg -x` into a sibling folder: the version is in its name
        version = version_from_filename(debs[0].name, package)
    return _describe(package, folder, version=version, deb=debs[0].name if len(debs) == 1 else None, source="folder")


def _load_record(done: Path) -> DebPackage:
    rec = json.loads((done / "package.json").read_text())
    rec["root"] = done / "root"
    rec["licenses"] = tuple(rec.get("licenses") or ())
    known = set(DebPackage.__dataclass_fields__)
    return DebPackage(**{k: v for k, v in rec.items() if k in known})


def _describe(package: str, root: Path, **kw: Any) -> DebPackage:
    cpath = root / "usr" / "share" / "doc" / package / "copyright"
    lic: LicenseInfo = parse_copyright(cpath.read_text(errors="replace")) if cpath.is_file() else LicenseInfo()
    return DebPackage(name=package, root=root, license=lic.main, licenses=lic.names, license_source=lic.source,
                      copyright=cpath.relative_to(root).as_posix() if cpath.is_file() else None, **kw)


def _apt_error(stderr: str) -> str:
    """apt's own reason, one line: its last "E:" line (e.g. "E: Unable to locate package foo")."""
    errs = [ln.strip() for ln in stderr.splitlines() if ln.startswith("E:")]
    if errs:
        return errs[-1]
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def version_from_filename(name: str, package: str) -> str | None:
    """The version in apt's file name ``<package>_<version>_<arch>.deb`` (an epoch's ":" is written "%3a")."""
    m = re.fullmatch(re.escape(package) + r"_(.+)_([^_]+)\.deb", name)
    return unquote(m.group(1)) if m else None


# ---------------------------------------------------------------------------------------------------------------
# Licences


@dataclass(frozen=True)
class LicenseInfo:
    main: str | None = None
    names: tuple[str, ...] = ()
    source: str = "none"


_GPL_NOTICE = re.compile(r"GNU\s+(Lesser\s+|Library\s+)?General\s+Public\s+License", re.I)
_GPL_VERSION = re.compile(r"version\s+(\d(?:\.\d)?)", re.I)
_LATER = re.compile(r"(any\s+later\s+version|or\s+later)", re.I)


def parse_copyright(text: str) -> LicenseInfo:
    """Licence short names from a Debian copyright file (see the module docstring)."""
    if re.match(r"\s*Format:", text):
        names: list[str] = []
        main = None
        for para in re.split(r"\n\s*\n", text):
            fields = _fields(para)
            lic = fields.get("license", "").split("\n")[0].strip()
            if not lic:
                continue
            if lic not in names:
                names.append(lic)
            if main is None and fields.get("files", "").split() == ["*"]:
                main = lic
        if names:
            return LicenseInfo(main or (names[0] if len(names) == 1 else None), tuple(names), "dep5")
    # A free-text file: the common GNU notice "... GNU General Public License ... version 2 ... or (at your option)
    # any later version". Anything else is left to the reader of the file (recorded as unknown).
    m = _GPL_NOTICE.search(text)
    if m:
        tail = text[m.start(): m.start() + 400]
        v = _GPL_VERSION.search(tail)
        name = ("LGPL" if m.group(1) else "GPL") + (f"-{v.group(1)}" if v else "") + ("+" if v and _LATER.search(tail) else "")
        return LicenseInfo(name, (name,), "text")
    return LicenseInfo()


def _fields(paragraph: str) -> dict[str, str]:
    """A deb822 paragraph's fields, lower-cased names; continuation lines joined with newlines."""
    out: dict[str, str] = {}
    key = None
    for line in paragraph.splitlines():
        if line[:1] in (" ", "\t") and key is not None:
            out[key] += "\n" + line.strip()
        elif ":" in line:
            k, _, v = line.partition(":")
            key = k.strip().lower()
            out[key] = v.strip()
    return out


# ---------------------------------------------------------------------------------------------------------------
# Unpacking


@dataclass
class _Member:
    name: str
    data: bytes = field(repr=False)


def unpack_deb(deb: Path, dest: Path) -> None:
    """Unpack the files of `deb` into `dest` (created): with ``dpkg -x`` where dpkg is installed, else in Python."""
    dest.mkdir(parents=True, exist_ok=True)  # dpkg -x creates only the last folder of its target
    dpkg = shutil.which("dpkg")
    if dpkg is not None:
        r = subprocess.run([dpkg, "-x", str(deb), str(dest)], capture_output=True, text=True)
        if r.returncode != 0:
            raise ValueError(f"dpkg -x failed: {_apt_error(r.stderr) or f'exit status {r.returncode}'}")
        return
    members = {m.name.rstrip("/"): m for m in ar_members(deb.read_bytes())}
    data = next((m for n, m in members.items() if n.startswith("data.tar")), None)
    if data is None:
        raise ValueError(f"{deb.name} holds no data.tar.* member (members: {', '.join(members) or 'none'})")
    extract_tar(_decompress(data), dest)


def ar_members(blob: bytes) -> list[_Member]:
    """The members of a Unix `ar` archive (the container of a .deb): 60-byte headers, data padded to even sizes."""
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError("not a .deb (ar) archive")
    out, pos = [], 8
    while pos + 60 <= len(blob):
        header = blob[pos: pos + 60]
        if header[58:60] != b"`\n":
            raise ValueError(f"damaged ar header at byte {pos}")
        name = header[:16].decode("ascii", "replace").strip()
        size = int(header[48:58].decode("ascii").strip())
        out.append(_Member(name, blob[pos + 60: pos + 60 + size]))
        pos += 60 + size + (size & 1)
    return out


def _decompress(m: _Member) -> bytes:
    """The tar inside data.tar.<ext>: gz, xz, bz2 and plain in the standard library; zst with the `zstd` program
    or the `zstandard` module where one is installed."""
    if not m.name.endswith(".zst"):
        return m.data  # tarfile reads gz, xz, bz2 and plain itself
    zstd = shutil.which("zstd")
    if zstd is not None:
        r = subprocess.run([zstd, "-dc"], input=m.data, capture_output=True)
        if r.returncode == 0:
            return r.stdout
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        raise ValueError(f"{m.name} is zstd-compressed: install dpkg, the zstd program, or `pip install zstandard`") from None
    return zstandard.ZstdDecompressor().decompressobj().decompress(m.data)


def extract_tar(data: bytes, dest: Path) -> None:
    """Regular files and folders of a tar into `dest`. Links, devices and any path leaving `dest` are not extracted:
    the readers need only the package's own files, and this keeps a damaged or hostile archive inside `dest`."""
    dest = dest.resolve()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for info in tar:
            target = (dest / info.name).resolve()
            if not (target == dest or dest in target.parents):
                continue
            if info.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif info.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(info)
                assert src is not None
                with src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
