from training.report.cli import main

raise SystemExit(main())
