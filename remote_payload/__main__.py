import sys

from remote_payload.cli import main

sys.exit(main())
