#!/usr/bin/env bash
# Fetch the public sources of golden/core into DIR (default: /tmp/golden-sources), from Debian's
# and PyPI's registries only, and write DIR/sources.json (package, version, licence, files, sha256).
# Only the builder needs them; evaluation reads the built JSONL shipped in the repo.
#
#   bash golden/core/fetch_sources.sh [DIR] && python golden/core/build.py --sources DIR
set -euo pipefail
DIR=${1:-/tmp/golden-sources}
PY=${PYTHON:-python3}
mkdir -p "$DIR/debs" "$DIR/x"
cd "$DIR/debs"
apt-get download jargon-text dict-devil bsdgames wordnet-base >/dev/null
for d in *.deb; do dpkg -x "$d" ../x; done
cd "$DIR"
"$PY" -m pip download -q --no-deps --only-binary=:all: gensim==4.4.0 -d wheels
whl=$(ls wheels/gensim-4.4.0-*.whl | head -1)
"$PY" - "$DIR" "$whl" <<'PYEOF'
import hashlib, json, subprocess, sys, zipfile
from pathlib import Path
root, whl = Path(sys.argv[1]), Path(sys.argv[2])
x = root / "x"
(x / "gensim").mkdir(exist_ok=True)
(x / "gensim" / "questions-words.txt").write_bytes(zipfile.ZipFile(whl).read("gensim/test/test_data/questions-words.txt"))
def deb_version(pkg):
    deb = next((root / "debs").glob(f"{pkg}_*.deb"))
    return subprocess.check_output(["dpkg-deb", "-f", str(deb), "Version"], text=True).strip()
def sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()
quiz = "usr/share/games/bsdgames/quiz"
sources = {
    "jargon": {"registry": "debian", "package": "jargon-text", "version": deb_version("jargon-text"),
               "licence": "public domain (Jargon File 4.4.7)", "files": ["usr/share/doc/jargon-text/jargon.txt.gz"]},
    "devil": {"registry": "debian", "package": "dict-devil", "version": deb_version("dict-devil"),
              "licence": "public domain (Ambrose Bierce, The Devil's Dictionary, 1911)", "files": ["usr/share/dictd/devil.dict.dz"]},
    "quiz": {"registry": "debian", "package": "bsdgames", "version": deb_version("bsdgames"),
             "licence": "BSD-3-Clause (bsd-games quiz data; some facts are dated)",
             "files": [f"{quiz}/{n}" for n in ("africa", "america", "asia", "europe", "state", "elements", "collectives", "babies", "sexes")]},
    "wordnet": {"registry": "debian", "package": "wordnet-base", "version": deb_version("wordnet-base"),
                "licence": "WordNet 3.0 licence (Princeton University; permissive, attribution)", "files": ["usr/share/wordnet/index.noun"]},
    "analogies": {"registry": "pypi", "package": "gensim", "version": "4.4.0",
                  "licence": "Apache-2.0 (gensim test data: Mikolov et al. 2013 word analogies)",
                  "files": ["gensim/questions-words.txt"], "extracted_from": whl.name},
}
for s in sources.values():
    s["sha256"] = {f: sha(x / f) for f in s["files"]}
(root / "sources.json").write_text(json.dumps(sources, indent=2) + "\n")
print(root / "sources.json")
PYEOF
