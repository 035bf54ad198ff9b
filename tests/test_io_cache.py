"""One cache-folder rule: corpora given in memory and the default pretraining corpus both go where
bertforge.io.cache.cache_dir says ($BERTFORGE_CACHE, else $XDG_CACHE_HOME/bertforge, else ~/.cache/bertforge)."""
from __future__ import annotations

from pathlib import Path

from bertforge.api.inputs import cached_corpus
from bertforge.io.cache import cache_dir
from bertforge.pretraining import default_corpus as corpus_module


def test_the_variable_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("BERTFORGE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "bertforge"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "bertforge"
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def test_in_memory_corpora_and_the_default_corpus_share_it(monkeypatch, tmp_path):
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus_module, "stdlib_documents", lambda: [["A first line.", "A second line."]])
    default = corpus_module.default_corpus()
    memory = cached_corpus(["a document given in memory"])
    assert Path(default).parent == tmp_path / "cache"
    assert Path(memory).is_relative_to(tmp_path / "cache")
    assert Path(default).read_text() == "A first line.\nA second line.\n"
