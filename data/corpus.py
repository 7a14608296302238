#!/usr/bin/python3
"""Build kvlab's English training corpus from Debian packages any machine can fetch.

Sources (downloaded with `apt-get download`, unpacked with `dpkg-deb -x`, no root needed):
  python3.11-doc  - reStructuredText sources of the Python 3.11 documentation (PSF licence)
  debian-handbook - "The Debian Administrator's Handbook", en-US HTML (GPL-2+ or CC-BY-SA 3.0)

Each source file is one document. Documents are cleaned to plain prose (markup removed, code
blocks and interactive sessions dropped) and assigned to a split by a hash of their name, so
the split is stable and whole documents never straddle splits:
  train  ~ 94%   data/work/corpus/train.txt   (not committed)
  valid  ~  3%   data/work/corpus/valid.txt   (not committed)
  eval         data/eval/heldout.txt          (committed; whole documents, >= 64k tokens)
Documents in a split file are separated by one line holding only "\f" (form feed).

Usage: data/corpus.py --work data/work [--eval-dir data/eval]
"""
import argparse
import hashlib
import html
import os
import re
import subprocess
import sys
from pathlib import Path

PACKAGES = ["python3.11-doc", "debian-handbook"]
DOC_SEPARATOR = "\n\f\n"


def fetch_packages(work: Path) -> Path:
    """apt-get download + dpkg-deb -x into work/pkgs/root; returns the root."""
    pkg_dir = work / "pkgs"
    root = pkg_dir / "root"
    pkg_dir.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        if not list(pkg_dir.glob(f"{name}_*.deb")):
            subprocess.run(["apt-get", "download", name], cwd=pkg_dir, check=True)
    if not root.exists():
        for deb in sorted(pkg_dir.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root


_ROLE = re.compile(r":[a-zA-Z:+-]+:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_+")
_INLINE = re.compile(r"``([^`]*)``")
_EMPH = re.compile(r"(\*\*|\*|`)([^*`\n]+?)\1_?")


def clean_rst(text: str) -> str:
    """reStructuredText -> prose paragraphs. Drops directives' own lines, literal blocks
    (the indented block after a line ending in '::'), >>> sessions and heading underlines."""
    out, para = [], []
    lines = text.splitlines()
    literal_indent = None  # indent of the line that opened a literal block / directive
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if not stripped or indent > literal_indent:
                continue
            literal_indent = None
        if not stripped:
            if para:
                out.append(" ".join(para))
                para = []
            continue
        if stripped.startswith(".. "):
            # directive: its options/body are indented below; keep prose bodies of
            # note/warning/function-like directives by only skipping the directive line itself,
            # but skip bodies of code-ish ones.
            if re.match(r"\.\. (code-block|sourcecode|highlight|productionlist|testcode|"
                        r"testoutput|doctest|literalinclude|index|toctree|_|\|)", stripped) \
                    or re.match(r"\.\. \S+ *$", stripped) and not stripped.endswith("::"):
                literal_indent = indent
            if para:
                out.append(" ".join(para))
                para = []
            continue
        if re.fullmatch(r"([=\-~^*#+\"'`:.])\1{2,}", stripped):
            continue  # heading over/underline
        if stripped.startswith((">>>", "...", "$ ", "| ")):
            continue
        s = stripped
        if s.endswith("::"):
            literal_indent = indent
            s = s[:-2].rstrip()
            s = s + ":" if s and not s.endswith(":") else s
            if not s:
                continue
        s = _LINK.sub(r"\1", s)
        s = _ROLE.sub(r"\1", s)
        s = _INLINE.sub(r"\1", s)
        s = _EMPH.sub(r"\2", s)
        s = re.sub(r"^[-*+] ", "", s)
        para.append(s)
    if para:
        out.append(" ".join(para))
    keep = [p for p in out if len(p) > 40 and sum(c.isalpha() for c in p) > 0.6 * len(p)]
    return "\n".join(re.sub(r"\s+", " ", p) for p in keep)


def clean_html(text: str) -> str:
    """Debian handbook HTML -> prose paragraphs (drops <pre>, scripts, navigation)."""
    body = re.search(r"<body.*?>(.*)</body>", text, re.S)
    text = body.group(1) if body else text
    text = re.sub(r"<(pre|script|style|head)[^>]*>.*?</\1>", " ", text, flags=re.S | re.I)
    text = re.sub(r"<div class=\"navfooter\".*", " ", text, flags=re.S)
    text = re.sub(r"</(p|div|h[1-6]|li|dt|dd|tr|table|title)>", "\n", text, flags=re.I)
    text = re.sub(r"<br\s*/?>", "\n", text, flags=re.I)
    text = re.sub(r"<[^>]+>", "", text)
    text = html.unescape(text)
    paras = [re.sub(r"\s+", " ", p).strip() for p in text.split("\n")]
    keep = [p for p in paras if len(p) > 40 and sum(c.isalpha() for c in p) > 0.6 * len(p)]
    return "\n".join(keep)


def collect_documents(root: Path):
    """Yields (name, cleaned text) in a fixed order."""
    py = root / "usr/share/doc/python3.11/html/_sources"
    for path in sorted(py.rglob("*.rst.txt")):
        yield "python3.11-doc/" + str(path.relative_to(py)), clean_rst(path.read_text("utf-8", "replace"))
    hb = root / "usr/share/doc/debian-handbook/html/en-US"
    for path in sorted(hb.glob("*.html")):
        yield "debian-handbook/" + path.name, clean_html(path.read_text("utf-8", "replace"))


def split_of(name: str) -> str:
    h = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 100
    return "eval" if h < 3 else "valid" if h < 6 else "train"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "work")
    ap.add_argument("--eval-dir", type=Path, default=Path(__file__).parent / "eval")
    args = ap.parse_args()
    root = fetch_packages(args.work)
    docs = {"train": [], "valid": [], "eval": []}
    names = {"train": [], "valid": [], "eval": []}
    for name, text in collect_documents(root):
        if len(text) < 500:
            continue
        s = split_of(name)
        docs[s].append(text)
        names[s].append(name)
    (args.work / "corpus").mkdir(parents=True, exist_ok=True)
    args.eval_dir.mkdir(parents=True, exist_ok=True)
    for s in ("train", "valid"):
        (args.work / "corpus" / f"{s}.txt").write_text(DOC_SEPARATOR.join(docs[s]) + "\n", "utf-8")
    (args.eval_dir / "heldout.txt").write_text(DOC_SEPARATOR.join(docs["eval"]) + "\n", "utf-8")
    (args.eval_dir / "heldout_documents.txt").write_text("\n".join(names["eval"]) + "\n", "utf-8")
    for s in docs:
        print(f"{s}: {len(docs[s])} documents, {sum(map(len, docs[s]))} characters", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
