from probe.console import main

raise SystemExit(main())
