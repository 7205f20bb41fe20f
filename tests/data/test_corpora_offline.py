"""Books and mathematics from Debian packages: the fetcher (with a fake apt-get/dpkg on PATH) and each reader on a
small sample in its real format, built here (R serialization with `rdata`'s writer, an LZW-compressed Bible Retrieval
System file, TeX, Metamath, Coq). Under -m slow, each corpus is really fetched and read (skipped without apt-get or
network)."""

import gzip
import io
import json
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rpt.cli import main as cli_main
from rpt.data import debian
from rpt.data.corpora import (
    HELDOUT_MIN_CHARS,
    KJV_BOOKS,
    SPLITS,
    AustenCorpus,
    CoqCorpus,
    KJVCorpus,
    MetamathCorpus,
    PariCorpus,
    Skips,
    load_corpus,
    ranked_splits,
    read_brs_text,
    read_lazyload,
    split_hash,
    split_metamath,
    split_of,
    unlzw,
)
from rpt.data.prepare import prepare
from rpt.data.store import TokenStore
from rpt.data.tokenizer import Tokenizer


def all_docs(corpus, skips=None):
    return {s: list(corpus.documents(s, skips)) for s in corpus.splits}


DEP5 = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: sample

Files: *
Copyright: 2020 Someone
License: CC0-1.0

Files: extra.mm
Copyright: 2019 Someone Else
License: GPL

Files: debian/*
Copyright: 2021 A Maintainer
License: GPL-2+

License: CC0-1.0
 The full text would be here.
"""


def copyright_file(root: Path, package: str, text: str = DEP5) -> None:
    path = root / "usr" / "share" / "doc" / package / "copyright"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ---------------------------------------------------------------------------------------------------------------
# The fetcher


def _tar(files: dict[str, bytes], mode: str, links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def make_deb(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None, data_ext: str = "xz",
             data: bytes | None = None) -> Path:
    """A real .deb: an ar archive of debian-binary, control.tar.gz and data.tar.<ext> (`data`: that member's bytes)."""
    members = [("debian-binary", b"2.0\n"), ("control.tar.gz", _tar({"./control": b"Package: x\n"}, "w:gz")),
               (f"data.tar.{data_ext}", data if data is not None else _tar(files, f"w:{data_ext}", links))]
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    path.write_bytes(bytes(out))
    return path


def fake_tools(tmp_path: Path, deb: Path | None, package: str, deb_name: str, apt_error: str = "",
               dpkg: bool = False) -> tuple[Path, Path]:
    """A bin folder holding a fake apt-get (copies `deb` into the working folder under apt's file name, or fails
    with `apt_error`) and optionally a fake dpkg; both log their arguments."""
    bindir, log = tmp_path / "bin", tmp_path / "calls.log"
    bindir.mkdir(exist_ok=True)
    if apt_error:
        body = f'echo "{apt_error}" >&2\nexit 100\n'
    else:
        body = f'if [ "$2" = "{package}" ]; then cp "{deb}" "./{deb_name}"; exit 0; fi\n'
        body += 'echo "E: Unable to locate package $2" >&2\nexit 100\n'
    (bindir / "apt-get").write_text(f'#!/bin/sh\nPATH=/usr/bin:/bin\necho "apt-get $*" >> "{log}"\n{body}')
    (bindir / "apt-get").chmod(0o755)
    if dpkg:
        script = (f'#!/bin/sh\nPATH=/usr/bin:/bin\necho "dpkg $*" >> "{log}"\n'
                  f'mkdir -p "$3/usr/share/doc/{package}" "$3/usr/share/data"\n'
                  f'printf "Format: x\\n\\nFiles: *\\nLicense: MIT\\n" > "$3/usr/share/doc/{package}/copyright"\n'
                  f'echo text > "$3/usr/share/data/file.txt"\n')
        (bindir / "dpkg").write_text(script)
        (bindir / "dpkg").chmod(0o755)
    return bindir, log


def test_fetch_unpacks_in_python_without_dpkg_and_caches(tmp_path, monkeypatch):
    files = {"./usr/share/data/file.txt": b"hello\n", "./usr/share/doc/sample/copyright": DEP5.encode(),
             "../escape.txt": b"outside"}
    deb = make_deb(tmp_path / "built.deb", files, links={"./usr/share/data/link": "/etc/passwd"})
    bindir, log = fake_tools(tmp_path, deb, "sample", "sample_1%3a2.0-3_all.deb")
    monkeypatch.setenv("PATH", str(bindir))  # no dpkg: the .deb is unpacked in Python
    cache = tmp_path / "cache"
    pkg = debian.fetch("sample", cache)
    assert (pkg.name, pkg.version, pkg.deb) == ("sample", "1:2.0-3", "sample_1%3a2.0-3_all.deb")
    assert (pkg.license, pkg.licenses, pkg.license_source) == ("CC0-1.0", ("CC0-1.0", "GPL", "GPL-2+"), "dep5")
    assert pkg.copyright == "usr/share/doc/sample/copyright" and pkg.source == "apt"
    assert pkg.root == cache / "sample" / "root" and (pkg.root / "usr/share/data/file.txt").read_text() == "hello\n"
    assert not (pkg.root / "usr/share/data/link").exists()  # links are not extracted
    assert not (cache / "sample" / "escape.txt").exists() and not (cache / "escape.txt").exists()
    import hashlib

    assert pkg.sha256 == hashlib.sha256((cache / "sample" / pkg.deb).read_bytes()).hexdigest()
    assert json.loads((cache / "sample" / "package.json").read_text())["version"] == "1:2.0-3"
    assert [p.name for p in cache.iterdir()] == ["sample"]  # no partial folder left
    again = debian.fetch("sample", cache)  # from the cache: apt-get is not run again
    assert again == pkg and log.read_text().splitlines() == ["apt-get download sample"]
    shutil.rmtree(pkg.root)  # an incomplete cache entry is fetched again
    refetched = debian.fetch("sample", cache)
    assert len(log.read_text().splitlines()) == 2 and (refetched.root / "usr/share/data/file.txt").is_file()
    assert (refetched.version, refetched.sha256) == (pkg.version, pkg.sha256)


@pytest.mark.parametrize("with_zstd", [False, True])
def test_fetch_zstd_data_without_dpkg(tmp_path, monkeypatch, with_zstd):
    tar = _tar({"./usr/share/data/file.txt": b"zst\n"}, "w")
    if with_zstd:
        if shutil.which("zstd") is None:
            pytest.skip("no zstd program here")
        tar = subprocess.run(["zstd", "-c"], input=tar, capture_output=True, check=True).stdout
    deb = make_deb(tmp_path / "built.deb", {}, data_ext="zst", data=tar)
    bindir, _ = fake_tools(tmp_path, deb, "sample", "sample_1_all.deb")
    if with_zstd:
        (bindir / "zstd").symlink_to(shutil.which("zstd"))
    monkeypatch.setenv("PATH", str(bindir))
    if with_zstd:
        assert (debian.fetch("sample", tmp_path / "cache").root / "usr/share/data/file.txt").read_text() == "zst\n"
        return
    monkeypatch.setitem(sys.modules, "zstandard", None)  # an installed zstandard would unpack it: hide it
    with pytest.raises(debian.PackageUnavailable) as e:
        debian.fetch("sample", tmp_path / "cache", spec="pari")
    assert "\n" not in str(e.value) and "data.tar.zst is zstd-compressed: install dpkg, the zstd program" in str(e.value)
    assert "apt-get download sample" in str(e.value)


def test_fetch_uses_dpkg_where_installed(tmp_path, monkeypatch):
    deb = make_deb(tmp_path / "built.deb", {"./x": b""})
    bindir, log = fake_tools(tmp_path, deb, "sample", "sample_0.5_all.deb", dpkg=True)
    monkeypatch.setenv("PATH", str(bindir))
    pkg = debian.fetch("sample", tmp_path / "cache")
    calls = log.read_text().splitlines()
    assert calls[0] == "apt-get download sample"
    assert calls[1].startswith("dpkg -x ") and calls[1].split()[2].endswith("/sample_0.5_all.deb")
    assert pkg.version == "0.5" and pkg.license == "MIT" and (pkg.root / "usr/share/data/file.txt").is_file()


@pytest.mark.parametrize("apt_error, reason", [
    ("", "E: Unable to locate package nope"),
    ("E: Failed to fetch http://deb.debian.org/debian/pool/x.deb  Temporary failure resolving 'deb.debian.org'",
     "Temporary failure resolving"),
])
def test_fetch_failure_is_one_line_naming_the_commands(tmp_path, monkeypatch, apt_error, reason):
    bindir, _ = fake_tools(tmp_path, None, "sample", "sample_1_all.deb", apt_error=apt_error)
    monkeypatch.setenv("PATH", str(bindir))
    cache = tmp_path / "cache"
    with pytest.raises(debian.PackageUnavailable) as e:
        debian.fetch("nope", cache, spec="kjv")
    msg = str(e.value)
    assert "\n" not in msg and reason in msg and "`apt-get download nope` failed" in msg
    assert f"cd {cache} && apt-get download nope && mkdir -p nope-root && dpkg -x nope_*.deb nope-root" in msg
    assert f"--corpus kjv@{cache}/nope-root" in msg
    assert [p.name for p in cache.iterdir()] == []  # the partial folder is removed


def test_no_apt_get_is_one_clear_line_also_from_the_cli(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("RPT_CACHE_DIR", str(tmp_path / "rc"))
    assert debian.cache_root() == tmp_path / "rc" / "debian"
    with pytest.raises(debian.PackageUnavailable, match=r"apt-get is not available here .* apt-get download "
                                                        r"bible-kjv-text .*--corpus kjv@"):
        load_corpus("kjv")
    assert cli_main(["prepare", "--corpus", "kjv", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rpt prepare: error: Debian package bible-kjv-text: apt-get is not")
    assert "dpkg -x bible-kjv-text_*.deb" in err and not (tmp_path / "out").exists()


def test_folder_spec_needs_no_apt_and_checks_the_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get: a folder is read as it is
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_corpus(f"pari@{tmp_path / 'nowhere'}")
    (tmp_path / "other").mkdir()
    with pytest.raises(FileNotFoundError, match="usr/share/pari/doc/parimacro.tex does not exist"):
        load_corpus(f"pari@{tmp_path / 'other'}")
    with pytest.raises(ValueError, match="takes no :<selection>"):
        load_corpus(f"pari:x@{tmp_path / 'other'}")
    with pytest.raises(ValueError, match="expected austen@<folder"):
        load_corpus("austen@")


def test_parse_copyright_and_version_from_filename():
    assert debian.parse_copyright(DEP5) == debian.LicenseInfo("CC0-1.0", ("CC0-1.0", "GPL", "GPL-2+"), "dep5")
    gpl = ("% Permission is granted to copy ... under the terms of the GNU General Public License as published by\n"
           "the Free Software Foundation; either version 2 of the License, or (at your option) any later version.")
    assert debian.parse_copyright(gpl) == debian.LicenseInfo("GPL-2+", ("GPL-2+",), "text")
    lgpl = "under the GNU Lesser General Public License version 2.1"
    assert debian.parse_copyright(lgpl).main == "LGPL-2.1"
    assert debian.parse_copyright("Users may copy, modify or distribute this file at will.") == debian.LicenseInfo()
    assert debian.version_from_filename("coq_8.16.1+dfsg-1+b2_amd64.deb", "coq") == "8.16.1+dfsg-1+b2"
    assert debian.version_from_filename("x_2%3a1.0-1_all.deb", "x") == "2:1.0-1"
    assert debian.version_from_filename("other_1_all.deb", "x") is None


# ---------------------------------------------------------------------------------------------------------------
# Split rule of the small corpora


def test_ranked_splits_hold_out_long_documents_by_hash_rank():
    sizes = {f"novel{i}": 50_000 for i in range(6)}
    got = ranked_splits(sizes)
    assert Counter(got.values()) == {"train": 4, "validation": 1, "test": 1}
    order = sorted(sizes, key=split_hash, reverse=True)
    assert got[order[0]] == "test" and got[order[1]] == "validation"
    assert ranked_splits(dict(reversed(list(sizes.items())))) == got  # independent of the input order
    sizes[order[0]] = HELDOUT_MIN_CHARS - 1  # too short to be held out: the next in rank takes its place
    got = ranked_splits(sizes)
    assert got[order[0]] == "train" and got[order[1]] == "test" and got[order[2]] == "validation"
    many = ranked_splits({f"book{i}": 30_000 for i in range(66)})
    assert Counter(many.values()) == {"train": 60, "validation": 3, "test": 3}
    assert set(ranked_splits({"a": 10**6, "b": 10**6}).values()) == {"train"}  # fewer than 3: all train
    assert Counter(ranked_splits({"a": 10**6, "b": 10**6, "c": 10**6}).values()) == {"train": 1, "validation": 1,
                                                                                      "test": 1}


# ---------------------------------------------------------------------------------------------------------------
# austen: R lazy-load data


NOVELS = ("emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility")


def write_lazyload(folder: Path, objects: dict, mode: int = 1) -> Path:
    """An R lazy-load database as R writes it: each object serialized (XDR, version 3, by `rdata`'s writer, byte for
    byte R's format) and compressed into the .rdb, the index a gzip-compressed serialized list in the .rdx."""
    from rdata.conversion import convert_python_to_r_data
    from rdata.unparser import unparse_data

    folder.mkdir(parents=True, exist_ok=True)
    rdb, variables = bytearray(), {}
    for name, value in objects.items():
        raw = unparse_data(convert_python_to_r_data(value), file_type="rds")
        assert raw.startswith(b"X\n\x00\x00\x00\x03")  # R's XDR serialization, format version 3
        body = zlib.compress(raw) if mode == 1 else b"X" + lzma.compress(raw)
        record = struct.pack(">I", len(raw)) + body
        variables[name] = np.array([len(rdb), len(record)], dtype=np.int32)
        rdb += record
    (folder / "Rdata.rdb").write_bytes(bytes(rdb))
    index = {"variables": variables, "references": {}, "compressed": True if mode == 1 else np.array([mode])}
    (folder / "Rdata.rdx").write_bytes(gzip.compress(unparse_data(convert_python_to_r_data(index), file_type="rds")))
    return folder / "Rdata.rdx"


def test_austen_reads_lazyload_novels_one_document_each(tmp_path, prose):
    pytest.importorskip("rdata.unparser", reason="rdata's writer (rdata >= 1.0) builds the sample")
    root = tmp_path / "janeaustenr"
    lines = {name: [name.upper(), "", "By Jane Austen", ""] + prose(i, 4000).splitlines() for i, name in enumerate(NOVELS)}
    objects = {name: np.array(v) for name, v in lines.items()}
    objects["a_number"] = np.array([1.5, 2.5])
    write_lazyload(root / "usr/lib/R/site-library/janeaustenr/data", objects)
    copyright_file(root, "r-cran-janeaustenr", DEP5.replace("CC0-1.0", "MIT"))
    (tmp_path / "r-cran-janeaustenr_1.0.0-1_all.deb").write_bytes(b"")  # apt-get download beside dpkg -x
    corpus = load_corpus(f"austen@{root}")
    assert isinstance(corpus, AustenCorpus) and corpus.spec == f"austen@{root}"
    skips = Skips()
    docs = all_docs(corpus, skips)
    got = {d.id: d.text for s in SPLITS for d in docs[s]}
    assert got == {name: "\n".join(v) + "\n" for name, v in lines.items()}
    assert {s: len(docs[s]) for s in SPLITS} == {"train": 4, "validation": 1, "test": 1}
    assert skips.counts == {"not_text": 1} and skips.examples == {"not_text": ["a_number"]}
    assert corpus.identity() == {"spec": f"austen@{root}", "package": "r-cran-janeaustenr", "version": "1.0.0-1"}
    (prov,) = corpus.provenance()["debian"]
    assert (prov["name"], prov["version"], prov["license"], prov["source"]) == ("r-cran-janeaustenr", "1.0.0-1", "MIT",
                                                                                "folder")
    assert "public domain" in corpus.provenance()["text_license"]


def test_lazyload_xz_records(tmp_path):
    pytest.importorskip("rdata.unparser", reason="rdata's writer (rdata >= 1.0) builds the sample")
    index = write_lazyload(tmp_path, {"b": np.array(["x", "y"]), "a": np.array(["z"])}, mode=3)
    assert [(n, list(v)) for n, v in read_lazyload(index)] == [("a", ["z"]), ("b", ["x", "y"])]


# ---------------------------------------------------------------------------------------------------------------
# kjv: the Bible Retrieval System's LZW-compressed text


def lzw_compress(data: bytes, max_bits: int = 16, clear_after: int | None = None) -> bytes:
    """Unix compress's LZW (block mode) without its header: the writer `unlzw` is checked against (and gzip -dc, a
    second decoder, checks this writer). Codes LSB first from 9 bits; when the decoder's next free code would not
    fit it widens, after padding to a whole group of 8 codes; `clear_after`: emit CLEAR after that many codes."""
    limit = 1 << max_bits
    acc = nbits = start = 0
    out = bytearray()
    state = {"n_bits": 9, "dec_size": 257, "codes": 0}

    def put(code: int) -> None:
        nonlocal acc, nbits
        acc |= code << nbits
        nbits += state["n_bits"]

    def pad() -> None:
        nonlocal nbits, start
        group = state["n_bits"] * 8
        nbits = start + -(-(nbits - start) // group) * group
        start = nbits

    def emit(code: int) -> None:
        maxcode = limit if state["n_bits"] == max_bits else (1 << state["n_bits"]) - 1
        if state["dec_size"] > maxcode and state["n_bits"] < max_bits:
            pad()
            state["n_bits"] += 1
        put(code)
        if code == 256:
            pad()
            state["n_bits"], state["dec_size"] = 9, 256
            return
        if state["codes"] and state["dec_size"] < limit:
            state["dec_size"] += 1
        state["codes"] += 1

    table = {bytes([i]): i for i in range(256)}
    w = b""
    for c in data:
        wc = w + bytes([c])
        if wc in table:
            w = wc
            continue
        emit(table[w])
        if clear_after is not None and state["codes"] == clear_after:
            emit(256)
            table = {bytes([i]): i for i in range(256)}
        elif len(table) + 1 < limit:
            table[wc] = len(table) + 1  # codes from 257: 256 is CLEAR
        w = bytes([c])
    if w:
        emit(table[w])
    while nbits > 0:
        out.append(acc & 0xFF)
        acc >>= 8
        nbits -= 8
    return bytes(out)


@pytest.mark.parametrize("clear_after", [None, 700])
def test_unlzw_decodes_compress_streams(clear_after, prose):
    data = (prose(1, 3000) + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" + prose(2, 9000)).encode()  # widths 9 to 13, KwKwK
    stream = lzw_compress(data, clear_after=clear_after)
    assert unlzw(stream) == data
    if shutil.which("gzip"):  # gzip reads .Z too: the writer above makes real compress streams
        r = subprocess.run(["gzip", "-dc"], input=b"\x1f\x9d\x90" + stream, capture_output=True)
        assert r.returncode == 0 and r.stdout == data
    assert unlzw(lzw_compress(b"abababababababab", max_bits=9), max_bits=9) == b"abababababababab"
    with pytest.raises(ValueError, match="corrupt"):
        unlzw(b"\xff\xff\xff\xff")


ABBREVIATIONS = ("Ge Exo Lev Num Deu Josh Jdgs Ruth 1Sm 2Sm 1Ki 2Ki 1Chr 2Chr Ezra Neh Est Job Psa Prv Eccl SSol Isa Jer "
                 "Lam Eze Dan Hos Joel Amos Obad Jonah Mic Nahum Hab Zep Hag Zec Mal Mat Mark Luke John Acts Rom 1Cor "
                 "2Cor Gal Eph Phi Col 1Th 2Th 1Tim 2Tim Titus Phmn Heb Jas 1Pet 2Pet 1Jn 2Jn 3Jn Jude Rev").split()


def brs_file(path: Path, text: bytes, block_size: int) -> Path:
    """A bible.data: "EC02" + description (84 bytes), block size and count, n + 1 offsets, a compress header, the
    blocks (each its own LZW stream)."""
    blocks = [lzw_compress(text[i: i + block_size]) for i in range(0, len(text), block_size)]
    first = 92 + 4 * (len(blocks) + 1) + 3
    offsets = [first]
    for b in blocks:
        offsets.append(offsets[-1] + len(b))
    head = b"EC02" + b"Compressed Data File".ljust(80, b"\0") + struct.pack(">II", block_size, len(blocks))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + struct.pack(f">{len(offsets)}I", *offsets) + b"\x1f\x9d\x90" + b"".join(blocks))
    return path


def test_kjv_one_document_per_book_from_the_compressed_file(tmp_path, prose):
    lines = ["Holy Bible, Authorized (King James) Version.  Textfile 930105."]
    want = {}
    for k, (abbrev, name) in enumerate(zip(ABBREVIATIONS, KJV_BOOKS, strict=True)):
        long = k % 9 == 0  # 8 books of >= 20,000 characters: the ones that may be held out
        verses = prose(k, 4000 if long else 30).splitlines()
        book = [f"{abbrev}{1 + v // 4}:{1 + v % 4} {t}" for v, t in enumerate(verses)]
        lines += book
        body = [f"{1 + v // 4}:{1 + v % 4} {t}" for v, t in enumerate(verses)]
        want[name] = f"{name}\n\n" + "\n".join(x + ("\n" if v % 4 == 3 and v + 1 < len(body) else "")
                                               for v, x in enumerate(body)) + "\n"
    text = ("\n".join(lines) + "\n").encode()
    root = tmp_path / "kjv-root"
    path = brs_file(root / "usr/lib/bible.data", text, block_size=8192)
    assert read_brs_text(path) == text.decode()
    corpus = load_corpus(f"kjv@{root}")
    assert isinstance(corpus, KJVCorpus)
    skips = Skips()
    docs = all_docs(corpus, skips)
    got = {d.id: d.text for s in SPLITS for d in docs[s]}
    assert got == want and list(got) != sorted(got)  # every book, in the Bible's order within each split
    assert {s: len(docs[s]) for s in SPLITS} == {"train": 60, "validation": 3, "test": 3}
    held = [d for s in ("validation", "test") for d in docs[s]]
    assert all(len(d.text) >= HELDOUT_MIN_CHARS for d in held)
    assert skips.counts == {"not_a_verse": 1}
    assert corpus.provenance()["debian"][0]["license"] is None and "public domain" in corpus.provenance()["text_license"]
    damaged = tmp_path / "bad/usr/lib/bible.data"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match="damaged block table"):
        read_brs_text(damaged)


# ---------------------------------------------------------------------------------------------------------------
# pari: TeX sources


def test_pari_one_document_per_tex_file(tmp_path, write):
    doc = tmp_path / "pari/usr/share/pari/doc"
    header = "% Copyright (c) 2000  The PARI Group\n%\n% This file is part of the PARI/GP documentation\n"
    chapter = (header + "\\chapter{Functions and Operations Available in PARI and GP}\n"
               "\\section{Standard monadic or dyadic operators}\n")
    write(doc / "parimacro.tex", header + "\\def\\kbd#1{{\\tt #1}}\n")
    write(doc / "usersch1.tex", chapter * 10)
    write(doc / "usersch3.tex", chapter * 2000)
    write(doc / "tutorial.tex", chapter * 1500)
    write(doc / "refcard.tex", chapter * 1200)
    write(doc / "develop.tex.gz", gzip.compress((chapter * 3).encode()))
    write(doc / "broken.tex.gz", b"not gzip")
    write(doc / "latin1.tex", "caf\u00e9".encode("latin-1"))
    write(doc / "users.pdf", b"%PDF-1.5")
    write(doc / "translations", "readline  @se:readline@2\n")
    copyright_file(tmp_path / "pari", "pari-doc", "under the terms of the GNU General Public License as published by "
                   "the Free Software Foundation; either version 2 of the License, or (at your option) any later version.")
    corpus = load_corpus(f"pari@{tmp_path / 'pari'}")
    assert isinstance(corpus, PariCorpus)
    skips = Skips()
    docs = all_docs(corpus, skips)
    got = {d.id: d.text for s in SPLITS for d in docs[s]}
    assert got == {"parimacro.tex": header + "\\def\\kbd#1{{\\tt #1}}\n", "usersch1.tex": chapter * 10,
                   "usersch3.tex": chapter * 2000, "tutorial.tex": chapter * 1500, "refcard.tex": chapter * 1200,
                   "develop.tex.gz": chapter * 3}
    assert skips.counts == {"bad_gzip": 1, "undecodable": 1}
    # Six documents, three long enough to be held out: one test, one validation (the two highest in hash rank).
    held = sorted(["usersch3.tex", "tutorial.tex", "refcard.tex"], key=split_hash, reverse=True)
    assert [d.id for d in docs["test"]] == held[:1] and [d.id for d in docs["validation"]] == held[1:2]
    assert corpus.provenance()["debian"][0]["license"] == "GPL-2+"


# ---------------------------------------------------------------------------------------------------------------
# metamath: part and chapter documents


def mm_header(decoration: str, title: str, note: str = "") -> str:
    line = (decoration * 80)[:79]
    return f"$(\n{line}\n  {title}\n{line}\n{note}$)\n\n"


def mm_statements(label: str, n: int) -> str:
    return "".join(f"  ${{\n    {label}{i}.1 $e |- ( ph -> ps ) $.\n    {label}{i} $p |- ( ph -> ch ) $=\n"
                   f"      ( wi ax-mp ) ABCDE $.\n  $}}\n" for i in range(n))


def test_split_metamath_cuts_parts_and_chapters_only():
    preamble = "$( set.mm - Version of 28-Dec-2020 $)\n\n"
    text = (preamble + mm_header("#*", "Metamath source file for logic and set theory")
            + "$( Contents of this header: comments only $)\n\n"
            + mm_header("#", "CLASSICAL FIRST-ORDER LOGIC WITH EQUALITY", "  A part's introduction.\n")
            + mm_header("#*", "Pre-logic") + "  $c ( $.  $( Left parenthesis $)\n" + mm_statements("a", 3)
            + mm_header("#*", "Propositional calculus") + mm_statements("b", 4)
            + mm_header("=-", "Implication") + mm_statements("c", 2)  # a section: no cut
            + mm_header("-.", "Subsection") + mm_statements("d", 1)  # a subsection: no cut
            + mm_header("#*", "Propositional calculus") + mm_statements("e", 2))  # a repeated title
    docs = split_metamath("set.mm", text)
    assert [i for i, _ in docs] == [
        "set.mm:Metamath source file for logic and set theory / CLASSICAL FIRST-ORDER LOGIC WITH EQUALITY / Pre-logic",
        "set.mm:Propositional calculus", "set.mm:Propositional calculus (2)"]
    assert "".join(t for _, t in docs) == text  # nothing lost, nothing repeated
    assert docs[0][1].startswith(preamble) and docs[1][1].startswith("$(\n#*#*")
    assert "Implication" in docs[1][1] and "c1 $p" in docs[1][1] and "e0 $p" in docs[2][1]
    assert split_metamath("peano.mm", "$c 0 + = $.\n") == [("peano.mm", "$c 0 + = $.\n")]


def test_metamath_corpus_default_selection_and_hash_splits(tmp_path, write):
    base = tmp_path / "mm/usr/share/metamath/databases"
    chapters = [f"Chapter {k}" for k in range(40)]
    set_mm = "".join(mm_header("#*", t) + mm_statements(f"s{k}x", 5) for k, t in enumerate(chapters))
    write(base / "set.mm", set_mm)
    write(base / "iset.mm", mm_header("#*", "Copied logic") + mm_statements("i", 2))
    write(base / "nf.mm", mm_header("#*", "Copied logic") + mm_statements("n", 2))
    write(base / "peano.mm", "$c 0 + = $.\n")
    copyright_file(tmp_path / "mm", "metamath-databases")
    corpus = load_corpus(f"metamath@{tmp_path / 'mm'}")
    assert isinstance(corpus, MetamathCorpus) and corpus.spec == f"metamath@{tmp_path / 'mm'}"
    docs = all_docs(corpus)
    ids = [d.id for s in SPLITS for d in docs[s]]
    assert sorted(ids) == sorted(["peano.mm"] + [f"set.mm:{t}" for t in chapters])  # iset.mm, nf.mm left out
    assert all(split_of(d.id) == s for s in SPLITS for d in docs[s])
    assert "".join(d.text for d in sorted((d for s in SPLITS for d in docs[s] if d.id.startswith("set.mm")),
                                          key=lambda d: chapters.index(d.id[7:]))) == set_mm
    every = load_corpus(f"metamath:all@{tmp_path / 'mm'}")
    assert sum(len(v) for v in all_docs(every).values()) == 43
    only = load_corpus(f"metamath:nf.mm,peano.mm@{tmp_path / 'mm'}")
    assert only.spec == f"metamath:nf.mm,peano.mm@{tmp_path / 'mm'}"
    assert sorted(d.id for v in all_docs(only).values() for d in v) == ["nf.mm:Copied logic", "peano.mm"]
    with pytest.raises(ValueError, match=r"no database\(s\) zf.mm .*iset.mm, nf.mm, peano.mm, set.mm"):
        load_corpus(f"metamath:zf.mm@{tmp_path / 'mm'}")
    assert corpus.provenance()["debian"][0]["license"] == "CC0-1.0"


# ---------------------------------------------------------------------------------------------------------------
# coq: library folders


def test_coq_one_document_per_library_folder(tmp_path, write):
    coq = tmp_path / "coq/usr/lib/ocaml/coq"
    write(coq / "theories/Init/Prelude.v", "Require Export Notations.\n")
    write(coq / "theories/Init/Logic.v", "Inductive True : Prop := I : True.\n")
    write(coq / "theories/Arith/PeanoNat.v", "Module Nat.\nEnd Nat.")
    write(coq / "theories/Arith/Sub/Minus.v", "(* nested *)\n")
    write(coq / "theories/Arith/PeanoNat.vo", b"\x00binary")
    write(coq / "theories/Arith/PeanoNat.glob", "F1\n")
    write(coq / "theories/Top.v", "Definition top := 1.\n")
    write(coq / "theories/Bad/Latin.v", "caf\u00e9".encode("latin-1"))
    write(coq / "user-contrib/Ltac2/Init.v", "Ltac2 Type int.\n")
    write(coq / "plugins/ignored.v", "not read\n")
    copyright_file(tmp_path / "coq", "libcoq-stdlib", DEP5.replace("CC0-1.0", "LGPL-2.1"))
    corpus = load_corpus(f"coq@{tmp_path / 'coq'}")
    assert isinstance(corpus, CoqCorpus)
    skips = Skips()
    docs = all_docs(corpus, skips)
    got = {d.id: d.text for s in SPLITS for d in docs[s]}
    assert got == {
        "theories/Arith": "(* ---- theories/Arith/PeanoNat.v ---- *)\nModule Nat.\nEnd Nat.\n"
                          "(* ---- theories/Arith/Sub/Minus.v ---- *)\n(* nested *)\n",
        "theories/Bad": "",
        "theories/Init": "(* ---- theories/Init/Logic.v ---- *)\nInductive True : Prop := I : True.\n"
                         "(* ---- theories/Init/Prelude.v ---- *)\nRequire Export Notations.\n",
        "theories/Top.v": "(* ---- theories/Top.v ---- *)\nDefinition top := 1.\n",
        "user-contrib/Ltac2": "(* ---- user-contrib/Ltac2/Init.v ---- *)\nLtac2 Type int.\n"}
    assert skips.counts == {"undecodable": 1} and skips.examples["undecodable"] == ["theories/Bad/Latin.v"]
    assert set(docs["train"]) == set(d for v in docs.values() for d in v)  # all short: none is held out


# ---------------------------------------------------------------------------------------------------------------
# The manifest records the packages


def test_prepare_writes_package_provenance_into_every_manifest(tmp_path, texts, write, capsys, monkeypatch):
    doc = tmp_path / "pari-root/usr/share/pari/doc"
    for i, t in enumerate(texts[:4]):
        write(doc / f"usersch{i}.tex", t)
    write(doc / "parimacro.tex", texts[4])
    copyright_file(tmp_path / "pari-root", "pari-doc", "GNU General Public License, version 2 or any later version")
    write(tmp_path / "pari-doc_2.15.2-1_all.deb", b"")
    tok = Tokenizer.train_bpe(texts, 300, cache_dir=tmp_path / "tok")
    summary = prepare(f"pari@{tmp_path / 'pari-root'}", tok, tmp_path / "out", progress=False)
    want = {"name": "pari-doc", "version": "2.15.2-1", "license": "GPL-2+", "source": "folder",
            "copyright": "usr/share/doc/pari-doc/copyright"}
    (pkg,) = summary.provenance["debian"]
    assert {k: pkg[k] for k in want} == want
    for s in SPLITS:
        manifest = TokenStore.open(tmp_path / "out" / s).manifest
        assert manifest["provenance"] == summary.provenance
        assert manifest["corpus"] == {"spec": f"pari@{tmp_path / 'pari-root'}", "package": "pari-doc",
                                      "version": "2.15.2-1"}
    assert json.loads((tmp_path / "out" / "prepare.json").read_text())["provenance"] == summary.provenance
    # The CLI prints the source under the table.
    monkeypatch.setenv("RPT_CACHE_DIR", str(tmp_path / "rc"))
    tok.save(tmp_path / "tok.json")
    assert cli_main(["prepare", "--corpus", f"pari@{tmp_path / 'pari-root'}", "--tokenizer", str(tmp_path / "tok.json"),
                     "--out", str(tmp_path / "out2"), "--no-progress"]) == 0
    assert "source: Debian package pari-doc 2.15.2-1, licence GPL-2+" in capsys.readouterr().out
    plain = prepare(str(doc), tok, tmp_path / "out3", progress=False)  # another corpus: no provenance key at all
    assert plain.provenance == {} and "provenance" not in TokenStore.open(tmp_path / "out3" / "train").manifest


# ---------------------------------------------------------------------------------------------------------------
# The real packages (-m slow): fetched into $RPT_CACHE_DIR/debian if set, else a temporary folder


@pytest.fixture(scope="module")
def debian_cache(tmp_path_factory):
    if os.environ.get("RPT_CACHE_DIR"):
        return debian.cache_root()
    return tmp_path_factory.mktemp("debian")


def real(spec: str, cache: Path):
    if shutil.which("apt-get") is None:
        pytest.skip("no apt-get here")
    try:
        return load_corpus(spec, cache_dir=cache)
    except debian.PackageUnavailable as e:  # no network, no apt lists: nothing to test here
        pytest.skip(str(e))


@pytest.mark.slow
def test_real_austen(debian_cache):
    pytest.importorskip("rdata")
    corpus = real("austen", debian_cache)
    docs = all_docs(corpus)
    assert {s: len(v) for s, v in docs.items()} == {"train": 4, "validation": 1, "test": 1}
    texts = {d.id: d.text for v in docs.values() for d in v}
    assert sorted(texts) == sorted(NOVELS) and all(len(t) > 400_000 for t in texts.values())
    assert texts["emma"].startswith("EMMA\n\nBy Jane Austen\n")
    assert corpus.provenance()["debian"][0]["license"] == "MIT" and corpus.package_info.version


@pytest.mark.slow
def test_real_kjv(debian_cache):
    corpus = real("kjv", debian_cache)
    skips = Skips()
    docs = all_docs(corpus, skips)
    books = {d.id: d.text for v in docs.values() for d in v}
    assert {s: len(v) for s, v in docs.items()} == {"train": 60, "validation": 3, "test": 3}
    assert sorted(books) == sorted(KJV_BOOKS) and skips.counts == {"not_a_verse": 1}
    assert sum(t.count("\n") - t.count("\n\n") - 1 for t in books.values()) == 31_102  # verses of the KJV
    assert books["Genesis"].startswith("Genesis\n\n1:1 In the beginning God created the heaven and the earth.\n")
    assert books["Revelation"].endswith("22:21 The grace of our Lord Jesus Christ be with you all. Amen.\n")


@pytest.mark.slow
def test_real_pari(debian_cache):
    corpus = real("pari", debian_cache)
    docs = all_docs(corpus)
    texts = {d.id: d.text for v in docs.values() for d in v}
    assert {f"usersch{i}.tex" for i in range(1, 9)} <= set(texts) and len(texts) >= 15
    assert len(texts["usersch3.tex"]) > 1_000_000 and all(len(docs[s]) >= 1 for s in SPLITS)
    assert corpus.provenance()["debian"][0]["license"] == "GPL-2+"


@pytest.mark.slow
def test_real_metamath(debian_cache):
    corpus = real("metamath", debian_cache)
    docs = all_docs(corpus)
    set_mm = [d for v in docs.values() for d in v if d.id.startswith("set.mm:")]
    assert len(set_mm) >= 100 and all(len(docs[s]) >= 3 for s in SPLITS)
    size = (corpus.data / "set.mm").stat().st_size
    assert sum(len(d.text) for d in set_mm) == size  # ASCII: characters = bytes; cut without loss
    assert not any(d.id.startswith(("iset.mm", "nf.mm")) for v in docs.values() for d in v)
    assert corpus.provenance()["debian"][0]["license"] == "CC0-1.0"


@pytest.mark.slow
def test_real_coq(debian_cache):
    corpus = real("coq", debian_cache)
    docs = all_docs(corpus)
    ids = {d.id for v in docs.values() for d in v}
    assert {"theories/Init", "theories/Reals", "user-contrib/Ltac2"} <= ids and len(ids) >= 30
    assert all(len(docs[s]) >= 1 for s in SPLITS)
    assert corpus.provenance()["debian"][0]["license"] == "LGPL-2.1"
