"""`python -m realm_hf_cli`: the `realm-hf` command, with the fast start of the console script."""

from . import main

raise SystemExit(main())
