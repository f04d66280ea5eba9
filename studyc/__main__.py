"""`python -m studyc`: the command line."""

import sys

from studyc.cli import main

if __name__ == "__main__":
    sys.exit(main())
