import sys

from studyc.cli import main

sys.exit(main())
