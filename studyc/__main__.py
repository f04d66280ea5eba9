"""`python -m studyc`: the command line."""

import sys

from studyc.cli import main

sys.exit(main())
