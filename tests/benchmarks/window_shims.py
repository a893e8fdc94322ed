"""Stand-ins for a GPU window's tools, for CPU tests of the window scripts.

:func:`install` writes a ``bin`` folder to put first on ``PATH``: a ``python3`` that appends
its arguments to a file as one JSON list per call and does nothing else (``python3 -c`` snippets
still run, with the test's interpreter), and an ``nvidia-smi`` that prints one line. A script run
with it launches nothing heavy, and the test then checks each recorded command line.
"""

import os
import stat
import sys

_PYTHON3 = """#!/bin/bash
if [ "$1" = "-c" ]; then exec "{py}" "$@"; fi
exec "{py}" -c 'import json, sys
with open("{calls}", "a") as f: f.write(json.dumps(sys.argv[1:]) + "\\n")' "$@"
"""


def install(directory: str, calls: str) -> str:
    """Writes ``<directory>/bin/python3`` (records to the file ``calls``, JSON lines) and
    ``<directory>/bin/nvidia-smi``; returns the ``bin`` path. Raises ``OSError`` if the folder
    cannot be written."""
    bin_dir = os.path.join(directory, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    for name, text in (("python3", _PYTHON3.format(py=sys.executable, calls=calls)),
                       ("nvidia-smi", "#!/bin/bash\necho 'no GPU (test)'\n")):
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return bin_dir
