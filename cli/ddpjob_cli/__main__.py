from ddpjob_cli import main

raise SystemExit(main())
