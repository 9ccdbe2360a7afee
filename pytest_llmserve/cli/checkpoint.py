"""``llmserve checkpoint dsa-tiny OUT``: write a tiny random-weight checkpoint for the GPU backend matrix.

The builder lives in :mod:`pytest_llmserve.testing.dsa_checkpoint` (numpy and the standard library only,
so the GPU machine runs it as ``python -m pytest_llmserve.testing.dsa_checkpoint`` too); this module only
registers the command.
"""

from __future__ import annotations

import argparse

from pytest_llmserve.testing.dsa_checkpoint import add_arguments, run_from_args


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("checkpoint", help="write a tiny random-weight checkpoint (dsa-tiny: DeepSeek-V3.2 DSA)")
    kinds = p.add_subparsers(dest="kind", required=True)
    dsa = kinds.add_parser("dsa-tiny", help="seeded random-weight DeepSeek-V3.2 (DSA) model with SmolLM2's "
                                            "tokenizer, byte-identical on any machine; fault variants")
    add_arguments(dsa)
    dsa.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # DsaCheckpointError is an LLMServeError: main() prints it as one line and exits 2.

    return run_from_args(args)
