"""``python -m grudge_stream.cli``: the ``grudge-stream`` command."""
import sys

from grudge_stream.cli import main

if __name__ == "__main__":
    sys.exit(main())
