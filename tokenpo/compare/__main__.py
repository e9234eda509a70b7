from tokenpo.compare.cli import main

raise SystemExit(main())
