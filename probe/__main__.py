from probe.cli import main

raise SystemExit(main())
