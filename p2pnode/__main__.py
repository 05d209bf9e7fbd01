import sys

from p2pnode.cli import main

sys.exit(main())
