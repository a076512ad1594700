import sys

from scratchlm.cli.main import main

sys.exit(main())
