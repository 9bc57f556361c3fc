"""``kandev-es-verify``: the offline verifier of the client-only distribution.
No server, no database: a proof bundle or a consistency proof, the log's
public key(s) in a keyring file (``kandev-es audit keyring`` prints one), and
the checkpoints the auditor kept (``--checkpoint``, as many as held).

    kandev-es-verify bundle BUNDLE.json --keyring KEYRING [--checkpoint MINE ...]
    kandev-es-verify consistency PROOF.json --keyring KEYRING
    kandev-es-verify checkpoint CHECKPOINT --keyring KEYRING
        [--witness-key VKEY ... --witnesses-required K]
    kandev-es-verify witness keygen|serve ...     (kandev_es_client.witness)

With ``--checkpoint``, a bundle must prove that its checkpoint extends each
of yours (it carries a consistency proof from your size: ``kandev-es identity
history --proof --consistency-from SIZE``), so no event your checkpoint
covers can be passed off as pending or as another history. With
``--witness-key`` (a witness's cosigner vkey, repeatable), the checkpoint must
carry cosignatures of at least ``--witnesses-required`` of them (default: all):
witnesses cosign only checkpoints consistent with what they cosigned before,
so a split view (another history shown to you) lacks them.

Exit status 0: verified; 1: something failed (the report says which event and
why); 2: the files could not be read, or are not what the command reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

USAGE_ERROR = 2
VERIFY_EXTRA = "pip install 'kandev-es-client[verify]'"

try:
    from kandev_es_client.ledger import verify_bundle, verify_consistency_bundle
    from kandev_es_client.merkle import ProofError
    from kandev_es_client.signed_note import Checkpoint, Keyring, NoteError, parse_keyring
    from kandev_es_client.witness import cosigners_of, parse_cosigner_vkey
except ModuleNotFoundError as missing:  # the plain client install: httpx only
    if missing.name != "cryptography":
        raise
    print(
        f"kandev-es-verify needs the verify extra (cryptography): {VERIFY_EXTRA}", file=sys.stderr
    )
    raise SystemExit(USAGE_ERROR) from None

WHAT = {
    "bundle": "a proof bundle (JSON, from `kandev-es identity history --proof`)",
    "consistency": "a consistency proof (JSON, from `kandev-es audit consistency`)",
    "checkpoint": "a signed checkpoint (from `kandev-es audit checkpoint`)",
}


class InputError(ValueError):
    """A file that is not what the command reads, said in plain words."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kandev-es-verify", description="Verify kandev-es history offline.",
        epilog="kandev-es-verify witness keygen|serve ...: run a C2SP tlog-witness"
        " (kandev-es-verify witness --help).",
    )
    parser.add_argument("kind", choices=("bundle", "consistency", "checkpoint"))
    parser.add_argument("file", type=Path)
    parser.add_argument("--keyring", type=Path, required=True,
                        help="the log's verifier keys (one vkey a line, or a JSON keyring)")
    parser.add_argument("--origin", help="the log's origin line, when known")
    parser.add_argument("--checkpoint", dest="held", type=Path, action="append", default=[],
                        metavar="FILE",
                        help="a checkpoint you kept (repeatable): the bundle must prove it"
                        " extends each")
    parser.add_argument("--witness-key", dest="witness_keys", action="append", default=[],
                        metavar="VKEY", help="a witness's cosigner key (repeatable)")
    parser.add_argument("--witnesses-required", type=int, metavar="K",
                        help="how many of the --witness-key witnesses must have cosigned"
                        " (default: all)")
    return parser


def _witness_keys(given: Sequence[str]) -> list[Any]:
    try:
        return [parse_cosigner_vkey(vkey) for vkey in given]
    except NoteError as error:
        raise InputError(f"--witness-key: {error}") from None


def _witnessed(note: str, args: argparse.Namespace) -> tuple[str, bool] | None:
    """Whether enough of the given witnesses cosigned the checkpoint of ``note``."""
    if not args.witness_keys:
        return None
    keys = _witness_keys(args.witness_keys)
    required = len(keys) if args.witnesses_required is None else args.witnesses_required
    if not 1 <= required <= len(keys):
        raise InputError(f"--witnesses-required must be from 1 to {len(keys)}")
    found = cosigners_of(note, keys)
    named = ", ".join(sorted(found)) or "none"
    line = f"witnesses: {len(found)} of {len(keys)} cosigned this checkpoint ({named})"
    if len(found) < required:
        return (f"{line}: FAILED: {required} required (a checkpoint no witness saw may be"
                " a split view: ask again once the witnesses have cosigned)"), False
    return f"{line}: OK", True


def _refuse_constant(name: str) -> Any:
    raise InputError(f"it holds {name}, which is not a number JSON allows")


def load_json(text: str, name: str, kind: str) -> Any:
    """The JSON document of a file, or InputError saying in words what it is."""
    if not text.strip():
        raise InputError(f"{name} is empty: expected {WHAT[kind]}")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except InputError as error:
        raise InputError(f"{name} is not {WHAT[kind]}: {error}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{name} is not JSON (line {error.lineno}, column {error.colno}):"
                         f" expected {WHAT[kind]}") from None
    except RecursionError:
        raise InputError(f"{name} is nested too deeply to be {WHAT[kind]}") from None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text") from None


def _held(paths: Sequence[Path], keyring: Keyring, origin: str | None) -> list[Checkpoint]:
    held = []
    for path in paths:
        text = _read(path)
        if not text.strip():
            raise InputError(f"your checkpoint {path} is empty")
        try:
            held.append(keyring.open_checkpoint(text, origin))
        except NoteError as error:
            raise InputError(f"your checkpoint {path}: {error}") from None
    return held


def _run(
    kind: str, path: Path, keyring: Keyring, args: argparse.Namespace
) -> tuple[bool, list[str]]:
    _witness_keys(args.witness_keys)  # a bad key is the caller's mistake, said first
    text = _read(path)
    if kind == "checkpoint":
        if not text.strip():
            raise InputError(f"{path} is empty: expected {WHAT[kind]}")
        checkpoint = keyring.open_checkpoint(text, args.origin)
        lines = [f"checkpoint {checkpoint.origin} size {checkpoint.size}: signature OK"]
        witnessed = _witnessed(text, args)
        if witnessed:
            lines.append(witnessed[0])
        return witnessed is None or witnessed[1], lines
    document = load_json(text, str(path), kind)
    if not isinstance(document, dict):
        raise InputError(f"{path} is not {WHAT[kind]}: it is not a JSON object")
    if kind == "consistency":
        old, new = verify_consistency_bundle(document, keyring, args.origin)
        return True, [f"{old.origin}: size {new.size} extends size {old.size}: OK"]
    held = _held(args.held, keyring, args.origin)
    report = verify_bundle(document, keyring, args.origin, held)
    if report.checkpoint is not None:
        witnessed = _witnessed(str(document.get("checkpoint")), args)
        if witnessed:
            report.held.append(witnessed)
    return report.ok, report.lines()


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["witness"]:
        from kandev_es_client.witness import main as witness_main

        return witness_main(given[1:])
    args = _parser().parse_args(given)
    try:
        keyring = parse_keyring(_read(args.keyring))
    except (OSError, InputError, NoteError) as error:
        print(f"kandev-es-verify: keyring {args.keyring}: {error}", file=sys.stderr)
        return USAGE_ERROR
    try:
        ok, lines = _run(args.kind, args.file, keyring, args)
    except (OSError, InputError) as error:
        print(f"kandev-es-verify: {error}", file=sys.stderr)
        return USAGE_ERROR
    except (NoteError, ProofError, ValueError, KeyError, TypeError) as error:
        ok, lines = False, [f"FAILED: {error}"]
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
