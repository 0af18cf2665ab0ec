from training.launch.kubernetes import main

raise SystemExit(main())
