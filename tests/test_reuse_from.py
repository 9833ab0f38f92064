"""`make mine FROM=<run>` (`--reuse-from`, pipeline/storage/tables.py: reuse_tables): a new run starts from another
run's finished tables, linked not copied, never over its own; a missing or same source is one line."""
from __future__ import annotations

import json

import pytest

from contramine.flows.cli import main as cli_main
from contramine.pipeline.storage.tables import TableMissing, reuse_tables


def _table(run, name, payload=b"shard"):
    (run / name).mkdir(parents=True)
    (run / name / "part-00000-of-00001.parquet").write_bytes(payload)
    (run / name / "_manifest.json").write_text(json.dumps({"shards": 1}))


def test_reuse_brings_finished_tables_as_links_and_never_replaces_the_runs_own(tmp_path):
    src, dst = tmp_path / "default", tmp_path / "other"
    for name in ("sentences", "embeddings", "pairs"):
        _table(src, name)
    (src / "train" / "simcse").mkdir(parents=True)  # not a table: no manifest
    (src / "half").mkdir()  # a table a killed stage left unfinished: no manifest either
    _table(dst, "embeddings", b"mine")
    assert reuse_tables(src, dst) == ["sentences", "pairs"]
    shard = "sentences/part-00000-of-00001.parquet"
    assert (dst / shard).stat().st_ino == (src / shard).stat().st_ino  # a hard link: no second copy on disk
    assert (dst / "embeddings" / "part-00000-of-00001.parquet").read_bytes() == b"mine"
    assert not (dst / "train").exists() and not (dst / "half").exists()
    assert [p.name for p in dst.iterdir() if p.name.startswith(".")] == [".lock"]  # no temporary folder left behind
    assert reuse_tables(src, dst) == []  # again: nothing new
    with pytest.raises(TableMissing, match="this run's own folder"):
        reuse_tables(src, src)
    with pytest.raises(TableMissing, match=r"nope/ holds no finished table"):
        reuse_tables(tmp_path / "nope", dst)


def test_mine_from_a_run_that_does_not_exist_is_one_line_and_mines_nothing(tmp_path, capsys, small_corpus):
    code = cli_main(["mine", "--run", "new", "--reuse-from", "nope", "--corpus", str(small_corpus),
                     "--set", f"run.root={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: --reuse-from: ") and "nope/ holds no finished table" in err[-1]
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())


# ---- a source run that commits while it is copied ---------------------------------------------------------------
def _sentences(texts):
    import pyarrow as pa

    from contramine.pipeline.schema import SCHEMAS

    return pa.Table.from_pylist([{"sid": i, "text": t, "n_words": 1, "line_no": i} for i, t in enumerate(texts)],
                                SCHEMAS["sentences"])


def test_a_table_committed_again_while_copied_is_copied_from_the_new_manifest(tmp_path, monkeypatch):
    """The copy takes its file list from the manifest bytes it copies; a listed file gone meanwhile starts the
    table over from the new manifest: the new run holds one whole snapshot, never a manifest without its files."""
    from contramine.pipeline.storage import tables
    from contramine.pipeline.storage.store import Store
    from contramine.pipeline.storage.tables import RunTables

    src, dst = tmp_path / "src", tmp_path / "dst"
    Store(src).write_table("sentences", [_sentences(["old a"]), _sentences(["old b"])], key="old")
    real, calls = tables._link_or_copy, []

    def commit_meanwhile(a, b, *checked):
        calls.append(a.name)
        if len(calls) == 1:  # the source's stage commits between our reading of its manifest and our first link
            Store(src).write_table("sentences", [_sentences(["new a"]), _sentences(["new b"])], key="new")
        return real(a, b, *checked)
    monkeypatch.setattr(tables, "_link_or_copy", commit_meanwhile)
    assert reuse_tables(src, dst) == ["sentences"]
    assert RunTables(dst).read("sentences").column("text").to_pylist() == ["new a", "new b"]
    assert (dst / "sentences" / "_manifest.json").read_bytes() == (src / "sentences" / "_manifest.json").read_bytes()
    listed = {e["file"] for e in RunTables(dst).manifest("sentences")["files"]}
    assert {p.name for p in (dst / "sentences").glob("part-*.parquet")} == listed


def test_a_table_that_keeps_losing_files_is_refused_in_one_line_and_not_left_half(tmp_path, monkeypatch):
    from contramine.pipeline.storage import tables
    from contramine.pipeline.storage.store import Store
    from contramine.pipeline.storage.tables import TableUnreadable

    src, dst = tmp_path / "src", tmp_path / "dst"
    Store(src).write_table("sentences", [_sentences(["a"])], key="k")

    def gone(a, b, *checked):
        raise FileNotFoundError(a)
    monkeypatch.setattr(tables, "_link_or_copy", gone)
    with pytest.raises(TableUnreadable) as e:
        reuse_tables(src, dst)
    assert "\n" not in str(e.value) and "was committed again 3 times while it was copied" in str(e.value)
    assert not (dst / "sentences").exists()
    assert [p.name for p in dst.iterdir()] == [".lock"]  # no temporary folder either
    monkeypatch.undo()
    assert reuse_tables(src, dst) == ["sentences"]  # the next FROM= brings it: nothing was taken as the run's own


def test_a_table_left_as_only_its_manifest_is_not_the_runs_own(tmp_path):
    """Older code could leave a copied table as its manifest alone: a later FROM= brings the table, where it
    skipped it as the run's own."""
    src, dst = tmp_path / "default", tmp_path / "other"
    _table(src, "sentences")
    (dst / "sentences").mkdir(parents=True)
    (dst / "sentences" / "_manifest.json").write_text(json.dumps({"shards": 1}))
    assert reuse_tables(src, dst) == ["sentences"]
    assert (dst / "sentences" / "part-00000-of-00001.parquet").read_bytes() == b"shard"


def test_a_malformed_source_manifest_is_one_line(tmp_path):
    from contramine.pipeline.engine.discovery import load_stages

    load_stages()  # the line names the writer's command, as the CLI's process (which loads the stages) says it
    from contramine.pipeline.storage.tables import TableUnreadable

    src, dst = tmp_path / "default", tmp_path / "other"
    _table(src, "sentences")
    (src / "sentences" / "_manifest.json").write_text(json.dumps({"shards": "x"}))
    with pytest.raises(TableUnreadable, match=r"^--reuse-from: table `sentences` of run 'default': .*--force`$"):
        reuse_tables(src, dst)
    assert not (dst / "sentences").exists()


def test_reuse_never_changes_the_source_runs_files(tmp_path):
    """The source's shards are hard links of the new run's: their modes, bytes and times stay as they were."""
    import os

    src, dst = tmp_path / "default", tmp_path / "other"
    _table(src, "sentences")
    shard = src / "sentences" / "part-00000-of-00001.parquet"
    os.chmod(shard, 0o400)  # e.g. a run its owner made read-only
    before = shard.stat()
    assert reuse_tables(src, dst) == ["sentences"]
    after = shard.stat()
    assert (dst / "sentences" / shard.name).stat().st_ino == after.st_ino
    assert (after.st_mode, after.st_mtime_ns, after.st_size) == (before.st_mode, before.st_mtime_ns, before.st_size)


# ---- a source run that is not ours to trust ----------------------------------------------------------------------
def test_a_shard_changed_after_its_commit_is_not_brought(tmp_path):
    """Bytes planted in a source shard after its commit (its manifest left as it was): the copy is checked against
    the source's manifest, so the table is refused in one line and none of it lands."""
    import os

    from contramine.pipeline.storage.store import Store
    from contramine.pipeline.storage.tables import TableUnreadable

    src, dst = tmp_path / "src", tmp_path / "dst"
    Store(src).write_table("sentences", [_sentences(["honest a"]), _sentences(["honest b"])], key="k")
    shard = sorted((src / "sentences").glob("part-*.parquet"))[1]
    planted = shard.with_name("planted")
    Store(tmp_path / "forger").write_table("sentences", [_sentences(["forged"]), _sentences(["forged"])], key="k")
    planted.write_bytes(sorted((tmp_path / "forger" / "sentences").glob("part-*.parquet"))[1].read_bytes())
    os.chmod(shard, 0o644)
    shard.write_bytes(planted.read_bytes())  # rewritten in place: the same inode, other rows
    with pytest.raises(TableUnreadable) as e:
        reuse_tables(src, dst)
    assert "\n" not in str(e.value) and str(e.value) == (f"--reuse-from: {shard} does not hash to what its table's "
                                                         f"manifest records (changed after its commit): the source "
                                                         f"table is not copied")
    assert not (dst / "sentences").exists()


@pytest.mark.parametrize("how", ["hard link", "copy"])
def test_a_link_swapped_in_after_the_check_is_never_followed(tmp_path, monkeypatch, how):
    """A shard replaced by a link to a file outside the run between the link check and the linking: it is linked
    (or copied) as the link it is, never its target, and refused in one line; the target's bytes land nowhere."""
    import os

    from contramine.pipeline.storage import tables
    from contramine.pipeline.storage.store import Store
    from contramine.pipeline.storage.tables import TableUnreadable

    src, dst, secret = tmp_path / "src", tmp_path / "dst", tmp_path / "secret.txt"
    secret.write_bytes(b"a file of the user's that no run may take in")
    Store(src).write_table("sentences", [_sentences(["a"])], key="k")
    real = tables._link_or_copy

    def swap_then_link(a, b, *checked):
        if a.suffix == ".parquet":
            a.unlink()
            a.symlink_to(secret)
        return real(a, b, *checked)
    monkeypatch.setattr(tables, "_link_or_copy", swap_then_link)
    if how == "copy":  # the source on another file system: no hard links from it
        link = os.link

        def no_hard_links_from_src(a, b, **k):
            if str(a).startswith(str(src)):
                raise OSError(18, "Invalid cross-device link")
            return link(a, b, **k)
        monkeypatch.setattr(os, "link", no_hard_links_from_src)
    with pytest.raises(TableUnreadable, match=r"^--reuse-from: .*part-00000-of-00001\.\w+\.parquet is a symbolic link, "
                                              r"not a shard file: the source table is not copied$"):
        reuse_tables(src, dst)
    monkeypatch.undo()
    assert not (dst / "sentences").exists()
    assert not any(f.is_file() and f.read_bytes() == secret.read_bytes() for f in dst.rglob("*"))


def test_a_faiss_index_is_brought_only_from_a_folder_only_this_user_writes(tmp_path):
    """`_index/` is what FAISS's read_index loads, which is not safe on a crafted file: it comes only from a run of
    this user's that no one else may write; from any other the neighbours stage builds it again."""
    import os

    index = "hnsw-" + "0" * 32 + ".faiss"
    for name, mode in (("own", 0o755), ("shared", 0o775)):  # the second: group-writable (a umask of 002)
        src, dst = tmp_path / name, tmp_path / f"from-{name}"
        _table(src, "neighbours")
        (src / "neighbours" / "_index").mkdir()
        (src / "neighbours" / "_index" / index).write_bytes(b"an index")
        os.chmod(src, mode)
        assert reuse_tables(src, dst) == ["neighbours"]
        assert (dst / "neighbours" / "_index" / index).exists() == (name == "own"), name
    (tmp_path / "own" / "neighbours" / "_index" / index).chmod(0o666)  # the file itself writable by others
    os.chmod(tmp_path / "own", 0o755)
    assert reuse_tables(tmp_path / "own", tmp_path / "again") == ["neighbours"]
    assert not (tmp_path / "again" / "neighbours" / "_index" / index).exists()


def test_another_accounts_run_is_neither_brought_nor_mined_into(tmp_path):
    """Its owner can rewrite a shard and the hashes its sidecar and manifest record: `--reuse-from` brought such a
    shard whole, and a run folder another account made first under a shared run.root was mined into, reusing it."""
    import os
    import pwd

    from contramine.pipeline.storage.lock import RunBusy, run_lock
    from contramine.pipeline.storage.tables import TableUnreadable

    nobody = pwd.getpwnam("nobody").pw_uid
    src = tmp_path / "theirs"
    _table(src, "sentences")
    os.chown(src, nobody, -1)
    assert reuse_tables(src, tmp_path / "as-root") == ["sentences"]  # root is exempt (a container over a host folder)
    real = os.getuid
    try:
        os.getuid = lambda: 4242  # a miner who is not root
        with pytest.raises(TableUnreadable, match=f"is another account's \\(uid {nobody}\\): only runs of your own"):
            reuse_tables(src, tmp_path / "mine")
        with pytest.raises(RunBusy, match=f"run folder {src} is another account's \\(uid {nobody}\\)"):
            with run_lock(src, "mine"):
                pass
    finally:
        os.getuid = real
    assert not (tmp_path / "mine" / "sentences").exists()
