#!/bin/sh
# make_corpus.sh — install the KJV text (Debian bible-kjv) and split it into train/data/.
set -e
cd "$(dirname "$0")"
command -v bible >/dev/null 2>&1 || apt-get install -y bible-kjv
mkdir -p data
bible -l0 Gen1:1-Rev22:21 > data/kjv_raw.txt
python3 make_corpus.py data/kjv_raw.txt --out data
