"""`bertforge analyze attention|heads|probe|importance|explain`: looking inside a model (see bertforge.analysis)."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="attention maps, head statistics, probing, head importance, attributions")
    verbs = p.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    del verbs
