from probe.console import run

raise SystemExit(run())
