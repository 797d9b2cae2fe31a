from producerkit.cli import main

raise SystemExit(main())
