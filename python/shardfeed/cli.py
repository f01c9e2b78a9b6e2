"""The ``shardfeed`` command, installed with the package.

It runs the same code as the binary built by ``cargo install --path cli``
(the ``shardfeed-cli`` crate), inside the package's native module.
"""

from __future__ import annotations

import signal
import sys

from . import _native


def main() -> None:
    """Run ``shardfeed`` with this process's arguments and exit with its code."""
    # As the binary does: Ctrl-C stops the command, a closed pipe
    # (`shardfeed inspect | head`) ends it quietly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(_native.cli_main(["shardfeed", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
