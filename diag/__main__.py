import sys

from pardiag.cli import main

sys.exit(main())
