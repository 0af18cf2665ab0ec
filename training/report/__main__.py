from training.report import main

raise SystemExit(main())
