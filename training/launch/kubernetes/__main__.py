from training.launch.kubernetes.cli import main

raise SystemExit(main())
