"""Build golden/core/<version> deterministically from the sources fetched by fetch_sources.sh.

    bash golden/core/fetch_sources.sh /tmp/golden-sources
    python golden/core/build.py --sources /tmp/golden-sources --out golden/core/v1 --seed 1234

The logic lives in quantize.golden.build; a version folder is immutable once built.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from quantize.golden.build import main

if __name__ == "__main__":
    sys.exit(main())
