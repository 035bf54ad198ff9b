"""The data flags every verb that reads texts or examples declares the same way: `--data` (a folder of splits, a
saved or Hub dataset, or one file) with `--data-config`, `--data-split` for verbs that read one input, and the column
flags `--text-col`, `--text-pair-col`, `--label-col` (default: the usual names, `bertforge.io.tables.pick_columns`).
docs/data.md lists the formats."""
from __future__ import annotations

import argparse

COLUMN_HELP = ("default: the first of text / text_pair, sentence1 / sentence2, premise / hypothesis, question / "
               "sentence, sentence present")


def add_data_args(p: argparse.ArgumentParser, help: str, required: bool = False) -> None:
    """`--data PATH` and `--data-config NAME`."""
    p.add_argument("--data", metavar="PATH", required=required, help=help)
    p.add_argument("--data-config", metavar="NAME",
                   help="a Hugging Face Hub dataset's configuration (e.g. --data nyu-mll/glue --data-config sst2); "
                        "read with the datasets library (bertforge[data]), from its cache when offline")


def add_input_split_args(p: argparse.ArgumentParser) -> None:
    """`--data-split NAME` and `--data-config NAME`: which split of a one-input verb's saved or Hub dataset."""
    p.add_argument("--data-split", metavar="NAME",
                   help="the split to read from a folder of splits, a saved DatasetDict or a Hub dataset (default: "
                        "its only split)")
    p.add_argument("--data-config", metavar="NAME", help="a Hugging Face Hub dataset's configuration (e.g. sst2)")


def add_corpus_column_arg(p: argparse.ArgumentParser) -> None:
    """`--text-col` of a corpus: the column its tables (and the field its jsonl files) give documents from."""
    p.add_argument("--text-col", metavar="COL",
                   help="the text column of the corpus' tables (csv, tsv, json, parquet, saved datasets; default: "
                        "the first of text, sentence, ... present) and the field of its jsonl files (default: text)")


def add_column_args(p: argparse.ArgumentParser, prefix: str = "", pair: bool = True, label: bool = True) -> None:
    """`--text-col`, and `--text-pair-col` / `--label-col` where the verb reads them."""
    p.add_argument("--text-col", metavar="COL", help=f"{prefix}the text column ({COLUMN_HELP})")
    if pair:
        p.add_argument("--text-pair-col", metavar="COL",
                       help=f"{prefix}the second text of a pair (default: the usual partner of the text column)")
    if label:
        p.add_argument("--label-col", metavar="COL",
                       help=f"{prefix}the label column (default: the first of label, labels, score present)")
