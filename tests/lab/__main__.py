"""``python -m tests.lab``: the crash lab's command line (:func:`tests.lab.lab.main`)."""

import sys

from .lab import main

sys.exit(main())
