"""``python -m dsl clean`` removes the kernel cache, and the rest only when asked."""

import json

import pytest

from dsl.cli import clean


def _touch(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def homes(tmp_path, monkeypatch):
    """A kernel cache, a tuning database and a working directory's kernel_meta, all in
    tmp_path, plus files beside them that clean must never touch."""
    cache, db, work = tmp_path / "cache", tmp_path / "tuning", tmp_path / "work"
    monkeypatch.setenv("DSL_CACHE_DIR", str(cache))
    monkeypatch.setenv("DSL_TUNING_DB", str(db))
    monkeypatch.chdir(_touch(work / "script.py").parent)
    files = {"cache": [_touch(cache / "kernel_meta" / "k.so"),
                       _touch(cache / "kernel_meta" / "k.json")],
             "db": [_touch(db / "llvm-x" / "w.jsonl")],
             "here": [_touch(work / "kernel_meta" / "mine.so")],
             "keep": [_touch(cache / "notes.txt"), _touch(work / "script.py")]}
    return files


def _exist(paths):
    return [p.exists() for p in paths]


def test_default_removes_only_the_kernel_cache(homes, capsys):
    assert clean.main([]) == 0
    out = capsys.readouterr().out
    assert _exist(homes["cache"]) == [False, False]
    assert all(_exist(homes["db"] + homes["here"] + homes["keep"]))
    assert "kernel cache" in out and "removed" in out and "tuning" not in out


def test_dry_run_removes_nothing_and_says_what_would_go(homes, capsys):
    assert clean.main(["--dry-run", "--tuning-db", "--kernel-meta"]) == 0
    out = capsys.readouterr().out
    assert all(_exist(sum(homes.values(), [])))
    assert out.count("would remove") == 3


def test_flags_add_the_tuning_db_and_kernel_meta(homes, capsys):
    assert clean.main(["--tuning-db", "--kernel-meta", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["caches"]
    assert [(r["what"], r["action"], r["files"]) for r in rows] == [
        ("kernel cache", "removed", 2), ("tuning database", "removed", 1),
        ("kernel_meta/ here", "removed", 1)]
    assert not any(_exist(homes["cache"] + homes["db"] + homes["here"]))
    assert all(_exist(homes["keep"]))


def test_a_symlink_is_removed_not_followed(homes, tmp_path, capsys):
    elsewhere = _touch(tmp_path / "precious" / "k.so").parent
    for p in homes["here"]:
        p.unlink()
    (tmp_path / "work" / "kernel_meta").rmdir()
    (tmp_path / "work" / "kernel_meta").symlink_to(elsewhere)
    assert clean.main(["--kernel-meta"]) == 0
    assert not (tmp_path / "work" / "kernel_meta").is_symlink()
    assert (elsewhere / "k.so").exists()


def test_switched_off_and_absent_caches(homes, monkeypatch, capsys):
    monkeypatch.setenv("DSL_TUNING_DB", "off")
    assert clean.main(["--tuning-db"]) == 0
    assert clean.main(["--json", "-"]) == 0  # again: nothing left
    out = capsys.readouterr().out
    assert "off" in out.split("\n{")[0]
    (row,) = json.loads("{" + out.split("\n{", 1)[1])["caches"]
    assert row["action"] == "absent"


def test_refuses_a_misdirected_home(homes, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "work"))
    monkeypatch.setenv("DSL_TUNING_DB", str(tmp_path / "work"))
    assert clean.main(["--tuning-db"]) == 1
    assert "refused" in capsys.readouterr().out
    assert all(_exist(homes["here"] + homes["keep"]))
