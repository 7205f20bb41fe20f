import gzip
import json
import sysconfig
from collections import Counter
from pathlib import Path

import pytest

from rpt.data.corpora import (
    SPLITS,
    CodeTreeCorpus,
    JsonlCorpus,
    Skips,
    StdlibCorpus,
    TextFolderCorpus,
    load_corpus,
    split_of,
)


def all_docs(corpus, skips=None):
    return {s: list(corpus.documents(s, skips)) for s in corpus.splits}


def test_split_of_is_deterministic_and_about_90_5_5():
    assert split_of("json") == split_of("json")
    counts = Counter(split_of(f"doc-{i}") for i in range(4000))
    assert set(counts) == set(SPLITS)
    assert 0.87 < counts["train"] / 4000 < 0.93
    assert 0.03 < counts["validation"] / 4000 < 0.07 and 0.03 < counts["test"] / 4000 < 0.07


def test_text_folder_hash_split_recursive_with_counted_skips(tmp_path, prose, write):
    root = tmp_path / "docs"
    good = {f"book{i}.txt": prose(i) for i in range(12)}
    good["nested/deeper/notes.md"] = "caf\u00e9 \u2713\n"
    for rel, text in good.items():
        write(root / rel, text)
    write(root / "bom.txt", "\ufeffstarts with a BOM")
    write(root / "cover.png", b"\x89PNG\x00\x01")
    write(root / "old.txt", "na\u00efve".encode("latin-1"))
    write(root / ".hidden" / "secret.txt", "not read")
    corpus = load_corpus(str(root))
    assert isinstance(corpus, TextFolderCorpus) and corpus.splits == SPLITS
    skips = Skips()
    docs = all_docs(corpus, skips)
    got = {d.id: d.text for s in SPLITS for d in docs[s]}
    assert got == {**good, "bom.txt": "starts with a BOM"}  # every readable file exactly once, BOM stripped
    for s in SPLITS:
        assert all(split_of(d.id) == s for d in docs[s])
        assert [d.id for d in docs[s]] == sorted(d.id for d in docs[s])
    assert skips.counts == {"binary": 1, "undecodable": 1}
    assert skips.examples == {"binary": ["cover.png"], "undecodable": ["old.txt"]}


def test_text_folder_with_split_folders(split_folder, write):
    write(split_folder / "README.txt", "about these books")
    write(split_folder / "extra" / "notes.txt", "not in a split")
    corpus = load_corpus(str(split_folder))
    assert corpus.splits == SPLITS
    skips = Skips()
    docs = all_docs(corpus, skips)
    assert skips.to_dict() == {"outside_split_folders": {"count": 2, "examples": ["README.txt", "extra/notes.txt"]}}
    assert [d.id for d in docs["validation"]] == ["validation_0.txt", "validation_1.txt"]
    assert len(docs["train"]) == 4 and len(docs["test"]) == 2
    only_train = TextFolderCorpus(split_folder / "train")  # no split folders below: hash split
    assert only_train.splits == SPLITS


def test_missing_split_is_an_error(bad_folder):
    corpus = load_corpus(str(bad_folder))
    assert corpus.splits == ("train",)
    with pytest.raises(ValueError, match="no split 'test'"):
        list(corpus.documents("test"))
    with pytest.raises(ValueError, match="unknown split"):
        list(corpus.documents("holdout"))
    assert [d.id for d in corpus.documents("train")] == ["empty.txt", "good.txt", "short.txt"]


def test_code_tree_repository_documents(tmp_path, prose, write):
    root = tmp_path / "repos"
    write(root / "pkg" / "__init__.py", "from .b import x\n")
    write(root / "pkg" / "b.py", "x = 1")  # no trailing newline: the next header still starts a line
    write(root / "pkg" / "sub" / "a.py", "y = 2\n")
    write(root / "pkg" / "README.md", "not code")
    write(root / "pkg" / "__pycache__" / "b.cpython-311.py", "compiled")
    write(root / "pkg" / "bad.py", b"s = '\xff\xfe'\n")
    write(root / "mod.py", "print('hi')\n")
    write(root / "docs" / "index.rst", "no python here")
    write(root / "notes.txt", "not a document")
    corpus = load_corpus(f"code:{root}")
    assert isinstance(corpus, CodeTreeCorpus)
    skips = Skips()
    docs = {d.id: d.text for s in SPLITS for d in corpus.documents(s, skips)}
    assert set(docs) == {"pkg", "mod", "docs"}
    assert docs["pkg"] == ("# ---- pkg/__init__.py ----\nfrom .b import x\n"
                           "# ---- pkg/b.py ----\nx = 1\n"
                           "# ---- pkg/sub/a.py ----\ny = 2\n")
    assert docs["mod"] == "# ---- mod.py ----\nprint('hi')\n"
    assert docs["docs"] == ""  # no .py files: an empty document, which prepare reports as "empty"
    assert skips.counts == {"undecodable": 1} and skips.examples["undecodable"] == ["pkg/bad.py"]
    for name in docs:
        assert any(d.id == name for d in corpus.documents(split_of(name)))


def test_jsonl_fields_splits_and_skips(tmp_path, prose, write):
    lines = [json.dumps({"id": "a", "text": "alpha", "split": "train"}).encode(),
             json.dumps({"id": "b", "text": "beta", "split": "dev"}).encode(),
             json.dumps({"text": "gamma"}).encode(),
             b"{broken json",
             json.dumps({"id": "c", "body": "no text field"}).encode(),
             b'{"id": "d", "text": "caf\xe9"}',
             json.dumps({"id": "e", "text": "x", "split": "holdout"}).encode(),
             b""]
    path = write(tmp_path / "c.jsonl", b"\n".join(lines) + b"\n")
    corpus = load_corpus(str(path))
    assert isinstance(corpus, JsonlCorpus)
    skips = Skips()
    docs = all_docs(corpus, skips)
    assert docs["train"][0] == ("a", "alpha")
    assert ("b", "beta") in docs["validation"]
    gamma = [d for s in SPLITS for d in docs[s] if d.text == "gamma"]
    assert gamma == [("c.jsonl:3", "gamma")] and gamma[0] in docs[split_of("c.jsonl:3")]
    assert skips.counts == {"bad_json": 1, "no_text": 1, "undecodable": 1, "bad_split": 1}  # once over all splits
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    from_gz = sorted(d.text for v in all_docs(load_corpus(str(gz))).values() for d in v)
    assert from_gz == sorted(d.text for v in docs.values() for d in v)


def test_stdlib_subset_grouped_by_package():
    corpus = load_corpus("stdlib:json,fnmatch")
    assert isinstance(corpus, StdlibCorpus) and corpus.spec == "stdlib:json,fnmatch"
    docs = {d.id: d.text for s in SPLITS for d in corpus.documents(s)}
    assert set(docs) == {"json", "fnmatch"}
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p.relative_to(root).as_posix() for p in (root / "json").rglob("*.py") if "__pycache__" not in p.parts)
    headers = [line[len("# ---- "):-len(" ----")] for line in docs["json"].splitlines() if line.startswith("# ---- json/")]
    assert headers == files and headers[0] == "json/__init__.py"
    assert docs["fnmatch"].startswith("# ---- fnmatch.py ----\n")
    assert docs["fnmatch"].endswith((root / "fnmatch.py").read_text())
    assert corpus.identity()["python"].count(".") == 2
    with pytest.raises(ValueError, match="no_such_pkg"):
        load_corpus("stdlib:json,no_such_pkg")
    with pytest.raises(ValueError, match="no package"):
        load_corpus("stdlib:test")  # excluded: the regression suite


def test_stdlib_exclusions():
    corpus = StdlibCorpus()
    names = corpus._all_names()
    assert {"json", "email", "asyncio", "os", "collections"} <= set(names)
    assert not {"test", "site-packages", "lib-dynload", "__pycache__"} & set(names)
    assert all(n.isidentifier() for n in names)
    assert sorted(names) == names and len(names) > 100
    root = Path(sysconfig.get_paths()["stdlib"])
    if (root / "unittest" / "test").is_dir():  # test folders inside packages are not read
        files = corpus._files(root / "unittest")
        assert files and not any(p.name in ("test", "tests") for f in files for p in f.relative_to(root).parents)
    assert {n: split_of(n) for n in ("json", "typing")} == {"json": split_of("json"), "typing": "test"}


def test_load_corpus_errors(tmp_path, prose, write):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_corpus(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus(f"code:{tmp_path / 'nowhere'}")
    write(tmp_path / "x.csv", "a,b\n")
    with pytest.raises(ValueError, match="jsonl"):
        load_corpus(str(tmp_path / "x.csv"))
    with pytest.raises(ValueError, match="at least one package"):
        load_corpus("stdlib:")


# -- Hugging Face datasets, on local files (no network) -------------------------------------------------------


@pytest.fixture
def hf_cache(tmp_path):
    pytest.importorskip("datasets")
    return tmp_path / "hf-cache"


def test_hf_pg19_layout_on_local_parquet(tmp_path, prose, write, hf_cache):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    local = tmp_path / "pg19"
    local.mkdir()
    for split, n in (("train", 3), ("validation", 1), ("test", 2)):
        pq.write_table(pa.table({"short_book_title": [f"{split} {i}" for i in range(n)], "publication_date": [1900] * n,
                                 "url": ["u"] * n, "text": [prose(i) for i in range(n)]}),
                       local / f"{split}-00000-of-00001.parquet")
    corpus = load_corpus(f"hf:pg19@{local}", cache_dir=hf_cache)
    assert corpus.splits == SPLITS and corpus.spec == f"hf:pg19@{local}"
    docs = all_docs(corpus)
    assert [d.id for d in docs["test"]] == ["test 0", "test 1"]
    assert docs["train"][2] == ("train 2", prose(2))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # pyarrow's, inside datasets' sort
def test_hf_codeparrot_groups_files_by_repository(tmp_path, prose, write, hf_cache):
    local = tmp_path / "codeparrot"
    rows = []
    for r in range(12):
        for path in ("setup.py", "pkg/a.py", "README.py"):
            rows.append({"repo_name": f"user/repo{r}", "path": path, "content": f"# {r} {path}\n", "size": "1"})
    rows.reverse()  # rows of a repository are not adjacent or ordered in the source
    write(local / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    corpus = load_corpus(f"hf:codeparrot@{local}", cache_dir=hf_cache)
    assert corpus.splits == SPLITS
    docs = all_docs(corpus)
    got = {d.id: d.text for s in SPLITS for d in docs[s]}
    assert set(got) == {f"user/repo{r}" for r in range(12)}
    assert got["user/repo3"] == "# ---- README.py ----\n# 3 README.py\n# ---- pkg/a.py ----\n# 3 pkg/a.py\n" \
                                "# ---- setup.py ----\n# 3 setup.py\n"
    for s in SPLITS:
        assert all(split_of(d.id) == s for d in docs[s])


def test_hf_generic_jsonl_file_and_offline_hub_error(tmp_path, prose, write, hf_cache, monkeypatch):
    path = write(tmp_path / "mine.jsonl", "".join(json.dumps({"text": prose(i)}) + "\n" for i in range(3)))
    corpus = load_corpus(f"hf:owner/thing@{path}", cache_dir=hf_cache)
    assert corpus.splits == ("train",)
    assert [d.id for d in corpus.documents("train")] == ["train/0", "train/1", "train/2"]

    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hub = load_corpus("hf:proof-pile", cache_dir=hf_cache)
    with pytest.raises(ValueError, match=r"hf:proof-pile: could not load .*hf:proof-pile@<folder>"):
        list(hub.documents("train"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_corpus(f"hf:pg19@{tmp_path / 'absent'}")
