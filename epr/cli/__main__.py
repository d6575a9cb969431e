"""``python -m epr.cli ...`` (``accelerate launch -m epr.cli``, ``torchrun -m epr.cli``): the ``epr`` command."""

import sys

from epr.cli import main

sys.exit(main())
