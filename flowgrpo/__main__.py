from flowgrpo.cli import main

raise SystemExit(main())
