from ddpjob_operator.cli import main

raise SystemExit(main())
