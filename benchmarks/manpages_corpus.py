"""A multilingual corpus from Debian's manual pages and their translations (manpages-l10n), for the XLM-RoBERTa
pretraining run in docs/pretraining.md: real text in several languages, available from the Debian archive
with no other network access. The text stays out of the repository; this script rebuilds it.

    mkdir -p /tmp/ml && cd /tmp/ml
    apt-get download manpages manpages-de manpages-fr manpages-es manpages-it manpages-ru
    for f in *.deb; do dpkg -x "$f" x; done
    python benchmarks/manpages_corpus.py --man x/usr/share/man --out /tmp/ml/corpus

Each page is rendered by groff (`groff -k -man -Tutf8`, unwrapped and unhyphenated: one paragraph per line), its
header and footer lines dropped, and written as one document (pages separated by a blank line) to
OUT/train/LANG.txt, or to OUT/heldout/LANG.txt for the pages whose name hashes into the held-out share: a page
held out is held out in every language, so no translation of a held-out page is trained on. `--max-characters`
caps each language's training text (pages in name order), so that no language fills most of the corpus.
OUT/stats.json counts pages and characters. English pages are the ones the `manpages` package has (man2-man7);
the others are under man/LANG/.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_common import save

LANGUAGES = ("en", "de", "fr", "es", "it", "ru")


def pages(man: Path, lang: str) -> list[Path]:
    root = man if lang == "en" else man / lang
    return sorted(p for p in root.glob("man[1-8]/*.gz") if p.is_file())


def render(page: Path) -> str:
    """The page as paragraphs of plain text, one per line ("" when groff cannot render it)."""
    source = gzip.decompress(page.read_bytes())
    if source.lstrip().startswith(b".so "):  # a link to another page
        return ""
    proc = subprocess.run(["groff", "-k", "-man", "-Tutf8", "-P-cbou", "-rLL=100000n", "-rHY=0"], input=source,
                          capture_output=True, timeout=60)
    lines = [re.sub(r"\s+", " ", line).strip() for line in proc.stdout.decode("utf-8", "replace").splitlines()]
    body = [line for line in lines if line][1:-1]  # the running header and footer
    return "\n".join(line for line in body if len(line) > 1)


def heldout(page: Path, share: float) -> bool:
    """The held-out split by page name (ls.1 is held out in every language or in none)."""
    name = page.name.removesuffix(".gz")
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--man", type=Path, required=True, help="the extracted usr/share/man")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--languages", nargs="+", default=list(LANGUAGES))
    ap.add_argument("--heldout-share", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-characters", type=int, default=None, help="training text per language (default: all)")
    args = ap.parse_args()
    stats = {}
    for lang in args.languages:
        found = pages(args.man, lang)
        with ThreadPoolExecutor(args.workers) as pool:
            texts = list(pool.map(render, found))
        split = {"train": [], "heldout": []}
        kept = 0
        for page, text in zip(found, texts):
            if not text:
                continue
            if heldout(page, args.heldout_share):
                split["heldout"].append(text)
            elif args.max_characters is None or kept < args.max_characters:
                split["train"].append(text)
                kept += len(text)
        for name, docs in split.items():
            (args.out / name).mkdir(parents=True, exist_ok=True)
            (args.out / name / f"{lang}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
        stats[lang] = {name: {"pages": len(docs), "characters": sum(map(len, docs))} for name, docs in split.items()}
        print(lang, json.dumps(stats[lang]), flush=True)
    save(args.out / "stats.json", stats)


if __name__ == "__main__":
    main()
