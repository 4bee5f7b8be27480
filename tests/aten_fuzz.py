"""The ATen fuzz harness's command line: schema-driven fuzzing of libopforge_aten, every allowed
ATen operator with hostile arguments. The harness is the package ``tests/aten_fuzzing/`` (its
docstring: the cases, the rules a case must pass, the output and how to run it); see ``--help``.

    python tests/aten_fuzz.py --case 1234                     # one case, verbose
"""

import sys

from aten_fuzzing.process import main

if __name__ == "__main__":
    sys.exit(main())
